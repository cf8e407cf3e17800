//! The shipped kernel text: a `.cu` source with its planted-fault blocks (`#ifdef FAULT_*` / `#ifndef FAULT_*` to
//! the matching `#endif`) reduced to the branch an unplanted build compiles. build.rs runs it over every module, so
//! the text NVRTC compiles in production carries no fault; the contract's planted builds compile the whole source.

/// One open conditional: whether it tests a `FAULT_*` symbol, and whether its current branch is kept.
struct Frame {
    fault: bool,
    keep: bool,
}

/// The directive a line holds (`#ifdef`, `#ifndef`, `#if`, `#else`, `#elif`, `#endif`) and its argument.
fn directive(line: &str) -> Option<(&str, &str)> {
    let rest = line.trim_start().strip_prefix('#')?.trim_start();
    let word = rest.split(|c: char| !c.is_ascii_alphanumeric()).next().unwrap_or("");
    Some((word, rest[word.len()..].trim()))
}

/// `text` with every planted-fault block reduced to what no `-DFAULT_*` define compiles: an `#ifdef FAULT_X` branch
/// dropped (its `#else` branch kept), an `#ifndef FAULT_X` branch kept (its `#else` dropped), the directives
/// themselves removed. Every removed line is left empty, so line numbers (NVRTC's messages) still match the file.
/// Panics on a fault block with `#elif` or a directive that names a `FAULT_` symbol any other way (build.rs runs
/// it on the sources of this folder, so a new form fails the build rather than ship).
pub fn strip_faults(text: &str) -> String {
    let mut stack: Vec<Frame> = Vec::new();
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let keep_here = stack.iter().all(|f| f.keep);
        let blank = if line.ends_with('\n') { "\n" } else { "" };
        let d = directive(line);
        let is_fault = |arg: &str| arg.starts_with("FAULT_");
        let emitted = match d {
            Some(("ifdef", arg)) if is_fault(arg) => {
                stack.push(Frame { fault: true, keep: false });
                false
            }
            Some(("ifndef", arg)) if is_fault(arg) => {
                stack.push(Frame { fault: true, keep: true });
                false
            }
            Some(("if" | "ifdef" | "ifndef", _)) => {
                assert!(!line.contains("FAULT_"), "an unsupported planted-fault directive: {line}");
                stack.push(Frame { fault: false, keep: true });
                keep_here
            }
            Some(("else", _)) if stack.last().is_some_and(|f| f.fault) => {
                let top = stack.last_mut().expect("an open block");
                top.keep = !top.keep;
                false
            }
            Some(("elif", _)) => {
                assert!(!stack.last().is_some_and(|f| f.fault), "#elif in a planted-fault block: {line}");
                keep_here
            }
            Some(("endif", _)) => stack.pop().is_none_or(|f| !f.fault) && keep_here,
            _ => keep_here,
        };
        out.push_str(if emitted { line } else { blank });
    }
    assert!(stack.is_empty(), "an unterminated conditional");
    out
}

#[cfg(test)]
mod tests {
    use super::strip_faults;

    #[test]
    fn fault_blocks_reduce_to_the_unplanted_branch_and_keep_line_numbers() {
        let src = "a\n#ifdef FAULT_A\nbad\n#else\ngood\n#endif\n#ifndef FAULT_B\nkept\n#else\ndropped\n#endif\n\
                   #ifdef FAULT_C\nonly planted\n#endif\n#if X\nx\n#else\ny\n#endif\nz";
        let out = strip_faults(src);
        assert_eq!(out.lines().count(), src.lines().count());
        let kept: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
        assert_eq!(kept, ["a", "good", "kept", "#if X", "x", "#else", "y", "#endif", "z"]);
        assert!(!out.contains("FAULT_"));
    }

    #[test]
    fn a_non_fault_conditional_inside_a_fault_block_is_dropped_with_it() {
        let out = strip_faults("#ifdef FAULT_A\n#if Y\ny\n#endif\n#else\nn\n#endif\n");
        assert_eq!(out.lines().filter(|l| !l.is_empty()).collect::<Vec<_>>(), ["n"]);
    }
}
