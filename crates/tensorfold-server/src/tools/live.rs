//! A call list read as it arrives (the stream's reader): each call is announced once its name and `(` are read,
//! then its arguments go out as fragments of the JSON text the whole reader would give (`{"key":` once a keyword
//! and `=` are read, a string value character by character, any other value once it has ended, `}` at `)`), so
//! the fragments joined are exactly the `arguments` of [`super::pyliteral::parse_calls`]. A call in the JSON form
//! goes out whole once its object closes. The reader fails at the first byte the whole reader would refuse.

use super::pyliteral::{MAX_BYTES, MAX_CALLS, read_call, read_string_run, read_value};
use serde_json::Value;

/// What the reader releases.
#[derive(Clone, Debug, PartialEq)]
pub enum Frag {
    /// A new call of this function (its arguments follow).
    Start(String),
    /// More of the latest call's arguments' JSON text.
    Args(String),
}

/// The list failed to read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Failed;

/// Where the reader is.
#[derive(Clone, Copy, Debug, PartialEq)]
enum State {
    /// Before `[`.
    Open,
    /// A call or `]`.
    Item,
    /// An argument or `)`.
    Arg,
    /// An argument's value.
    Value,
    /// Inside a string value quoted by this byte.
    Str(u8),
    /// Inside another value, or a JSON-form call.
    Scan(Scan),
    /// `,` or `)` after a value.
    AfterValue,
    /// `,` or `]` after a call.
    AfterCall,
    /// After `]`.
    Done,
}

/// How far a value's extent has been scanned (brackets and quotes counted, nothing read yet).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Scan {
    start: usize,
    i: usize,
    depth: usize,
    quote: Option<u8>,
    escaped: bool,
    /// A JSON-form call (else an argument value).
    call: bool,
}

/// The reader of one call list (the text after its opening marker).
#[derive(Clone, Debug)]
pub struct ListReader {
    offered: Vec<String>,
    /// The list's text so far.
    s: String,
    /// Bytes read and released.
    at: usize,
    state: State,
    /// The keywords of the call being read.
    keys: Vec<String>,
    /// Calls announced.
    pub started: usize,
    /// Calls whose arguments were closed.
    pub closed: usize,
}

impl ListReader {
    /// A reader of a list whose calls may name `offered`.
    pub fn new(offered: Vec<String>) -> Self {
        Self { offered, s: String::new(), at: 0, state: State::Open, keys: Vec::new(), started: 0, closed: 0 }
    }

    /// Reads `text`, releasing into `out` what became certain.
    ///
    /// # Errors
    /// [`Failed`] when the list cannot read, whatever follows.
    pub fn push(&mut self, text: &str, out: &mut Vec<Frag>) -> Result<(), Failed> {
        self.s.push_str(text);
        if self.s.len() > MAX_BYTES {
            return Err(Failed);
        }
        while self.step(out)? {}
        Ok(())
    }

    /// The list has ended (its closing marker): whether it read whole.
    pub fn end(&self) -> Result<(), Failed> {
        if self.state == State::Done && self.s[self.at..].bytes().all(|c| c.is_ascii_whitespace()) {
            Ok(())
        } else {
            Err(Failed)
        }
    }

    /// The text not released: the whole list before any call was announced, else what follows the last release.
    pub fn unreleased(&self) -> &str {
        if self.started == 0 { &self.s } else { &self.s[self.at..] }
    }

    /// One step: `Ok(false)` when more text is needed.
    fn step(&mut self, out: &mut Vec<Frag>) -> Result<bool, Failed> {
        if !matches!(self.state, State::Str(_) | State::Scan(_)) {
            let ws = self.s[self.at..].bytes().take_while(u8::is_ascii_whitespace).count();
            self.at += ws;
        }
        let Some(&c) = self.s.as_bytes().get(self.at) else { return Ok(false) };
        match self.state {
            State::Open if c == b'[' => self.take(1, State::Item),
            State::Item if c == b']' && self.started > 0 => self.take(1, State::Done),
            State::Item if c == b'{' => self.state = State::Scan(Scan::new(self.at, true)),
            State::Item => return self.start_call(out),
            State::Arg if c == b')' => self.close_call(out),
            State::Arg => return self.key(out),
            State::Value if c == b'"' || c == b'\'' => {
                out.push(Frag::Args("\"".into()));
                self.take(1, State::Str(c));
            }
            State::Value => self.state = State::Scan(Scan::new(self.at, false)),
            State::Str(q) => return self.string(q, out),
            State::Scan(sc) => return self.scan(sc, out),
            State::AfterValue if c == b',' => self.take(1, State::Arg),
            State::AfterValue if c == b')' => self.close_call(out),
            State::AfterCall if c == b',' => self.take(1, State::Item),
            State::AfterCall if c == b']' => self.take(1, State::Done),
            _ => return Err(Failed),
        }
        Ok(true)
    }

    fn take(&mut self, n: usize, next: State) {
        self.at += n;
        self.state = next;
    }

    /// `)`: the arguments' object closed.
    fn close_call(&mut self, out: &mut Vec<Frag>) {
        out.push(Frag::Args(if self.keys.is_empty() { "{}" } else { "}" }.into()));
        self.closed += 1;
        self.take(1, State::AfterCall);
    }

    /// The name at `at` and the byte offset past the `punct` that must follow it (spaces between allowed):
    /// `Ok(None)` while either may still be arriving.
    fn name_then(&self, punct: u8) -> Result<Option<(String, usize)>, Failed> {
        let b = self.s.as_bytes();
        let end = self.at + b[self.at..].iter().take_while(|&&c| name_char(c)).count();
        let after = end + b[end..].iter().take_while(|c| c.is_ascii_whitespace()).count();
        match b.get(after) {
            _ if end == self.at => Err(Failed),
            None => Ok(None),
            Some(&c) if c == punct => Ok(Some((self.s[self.at..end].to_string(), after + 1))),
            Some(_) => Err(Failed),
        }
    }

    /// `name(`: a call of an offered function announced.
    fn start_call(&mut self, out: &mut Vec<Frag>) -> Result<bool, Failed> {
        let Some((name, next)) = self.name_then(b'(')? else { return Ok(false) };
        self.announce(name, out)?;
        self.take(next - self.at, State::Arg);
        Ok(true)
    }

    fn announce(&mut self, name: String, out: &mut Vec<Frag>) -> Result<(), Failed> {
        if !self.offered.contains(&name) || self.started == MAX_CALLS {
            return Err(Failed);
        }
        self.started += 1;
        self.keys.clear();
        out.push(Frag::Start(name));
        Ok(())
    }

    /// `key=`: the argument's key released (after `{` or `,`).
    fn key(&mut self, out: &mut Vec<Frag>) -> Result<bool, Failed> {
        let Some((key, next)) = self.name_then(b'=')? else { return Ok(false) };
        if self.keys.contains(&key) {
            return Err(Failed);
        }
        let sep = if self.keys.is_empty() { "{" } else { "," };
        out.push(Frag::Args(format!("{sep}{}:", Value::String(key.clone()))));
        self.keys.push(key);
        self.take(next - self.at, State::Value);
        Ok(true)
    }

    /// A string value's characters up to the last whole escape, as JSON text; its end releases `"`.
    fn string(&mut self, quote: u8, out: &mut Vec<Frag>) -> Result<bool, Failed> {
        let b = self.s.as_bytes();
        let mut i = self.at;
        let closed = loop {
            match b.get(i) {
                None => break false,
                Some(&c) if c == quote => break true,
                Some(b'\\') => match escape_len(&b[i..]) {
                    // An escape cut inside a character has a non-hex digit: the whole reader refuses it too.
                    Some(n) if !self.s.is_char_boundary(i + n) => return Err(Failed),
                    Some(n) => i += n,
                    None => break false,
                },
                Some(b'\n') => return Err(Failed),
                Some(_) => i += 1,
            }
        };
        if i > self.at {
            let run = read_string_run(quote, &self.s[self.at..i]).map_err(|_| Failed)?;
            let json = Value::String(run).to_string();
            out.push(Frag::Args(json[1..json.len() - 1].to_string()));
        }
        self.at = i;
        if !closed {
            return Ok(false);
        }
        out.push(Frag::Args("\"".into()));
        self.take(1, State::AfterValue);
        Ok(true)
    }

    /// Scans a value's extent; once it has ended, reads it whole and releases its JSON text (a JSON-form call:
    /// announces it and releases its arguments).
    fn scan(&mut self, mut sc: Scan, out: &mut Vec<Frag>) -> Result<bool, Failed> {
        let b = self.s.as_bytes();
        let ended = loop {
            let Some(&c) = b.get(sc.i) else { break false };
            if let Some(q) = sc.quote {
                match c {
                    _ if sc.escaped => sc.escaped = false,
                    b'\\' => sc.escaped = true,
                    _ if c == q => sc.quote = None,
                    _ => {}
                }
            } else {
                match c {
                    b'"' | b'\'' => sc.quote = Some(c),
                    b'[' | b'(' | b'{' => sc.depth += 1,
                    b']' | b')' | b'}' if sc.depth == 0 => break true,
                    b']' | b')' | b'}' if sc.depth == 1 => {
                        sc.i += 1;
                        break true;
                    }
                    b']' | b')' | b'}' => sc.depth -= 1,
                    b',' if sc.depth == 0 => break true,
                    c if sc.depth == 0 && c.is_ascii_whitespace() => break true,
                    _ => {}
                }
            }
            sc.i += 1;
        };
        if !ended {
            self.state = State::Scan(sc);
            return Ok(false);
        }
        let text = &self.s[sc.start..sc.i];
        if sc.call {
            let call = read_call(text).map_err(|_| Failed)?;
            self.announce(call.name, out)?;
            out.push(Frag::Args(Value::Object(call.arguments).to_string()));
            self.closed += 1;
            self.take(sc.i - self.at, State::AfterCall);
        } else {
            out.push(Frag::Args(read_value(text).map_err(|_| Failed)?.to_string()));
            self.take(sc.i - self.at, State::AfterValue);
        }
        Ok(true)
    }
}

impl Scan {
    fn new(start: usize, call: bool) -> Self {
        Self { start, i: start, depth: 0, quote: None, escaped: false, call }
    }
}

/// A name or keyword character (what the whole reader takes).
fn name_char(c: u8) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-')
}

/// The bytes of the escape that `r` starts with (`r[0]` is `\`), or `None` while it may still be arriving: a
/// `\uD8xx` high surrogate waits for a following `\u`, which the whole reader joins to it.
fn escape_len(r: &[u8]) -> Option<usize> {
    let c = *r.get(1)?;
    let need = match c {
        b'x' => 4,
        b'U' => 10,
        b'u' => {
            let hex = std::str::from_utf8(r.get(2..6)?).ok().and_then(|h| u32::from_str_radix(h, 16).ok());
            match hex {
                Some(h) if (0xD800..0xDC00).contains(&h) && r.get(6..8)? == b"\\u" => 12,
                _ => 6,
            }
        }
        c if c < 0x80 => 2,
        c if c >= 0xF0 => 5,
        c if c >= 0xE0 => 4,
        _ => 3,
    };
    (r.len() >= need).then_some(need)
}

#[cfg(test)]
mod tests {
    use super::super::pyliteral::parse_calls;
    use super::*;

    /// The calls (name, arguments text) of `text` fed in pieces of `step` bytes (at character boundaries).
    fn live(text: &str, step: usize) -> Result<Vec<(String, String)>, Failed> {
        let mut r = ListReader::new(vec!["f".into(), "get_weather".into(), "now".into()]);
        let mut out = Vec::new();
        let mut from = 0;
        while from < text.len() {
            let mut to = (from + step).min(text.len());
            while !text.is_char_boundary(to) {
                to += 1;
            }
            r.push(&text[from..to], &mut out)?;
            from = to;
        }
        r.end()?;
        let mut calls: Vec<(String, String)> = Vec::new();
        for f in out {
            match f {
                Frag::Start(n) => calls.push((n, String::new())),
                Frag::Args(a) => calls.last_mut().expect("a call").1 += &a,
            }
        }
        Ok(calls)
    }

    fn whole(text: &str) -> Vec<(String, String)> {
        let calls = parse_calls(text).unwrap();
        calls.into_iter().map(|c| (c.name, Value::Object(c.arguments).to_string())).collect()
    }

    #[test]
    fn fragments_join_to_the_whole_readers_arguments_at_every_split() {
        for text in [
            r#"[get_weather(city="Paris")]"#,
            r#" [ get_weather ( city = 'Saint-Denis, [FR] \'92\'' , days=[1, (2, 3)], opts={"u": "C", 'k': [None]},) , now() , ]"#,
            r#"[f(s="a\"b\\c\t\u00e9\x41\U0001F600\uD83D\uDE00 é😀 \q", n=-1.5e3, t=True, big=123456789012345678901234)]"#,
            r#"[{"name": "get_weather", "arguments": {"city": "Oslo"}}, f(a=1)]"#,
            r#"[now(), now()]"#,
        ] {
            for step in [1, 2, 3, 7, 1000] {
                assert_eq!(live(text, step), Ok(whole(text)), "{text} by {step}");
            }
        }
    }

    #[test]
    fn what_the_whole_reader_refuses_fails_here() {
        for text in [
            "[f(1)]",
            "[f(a=1, a=2)]",
            "[f(a=x)]",
            "[unknown()]",
            "[f(a=1) g()]",
            "[]",
            "[f(a='x\n')]",
            "[f(a=\"\\x4\")]",
            "[f(a=\"\\uD800\")]",
            "[f(a=\"\\x4é\")]",
            "[f(a=[1)]",
            "[f(a=1)] trailing",
            "[f(a=1)",
            "[f(a='open",
            "f()",
        ] {
            for step in [1, 4, 1000] {
                // (A name not offered reads, but the splitter refuses it as the live reader does.)
                assert!(parse_calls(text).is_err() || text.contains("unknown"), "{text:?}");
                assert_eq!(live(text, step), Err(Failed), "{text:?} by {step}");
            }
        }
    }

    #[test]
    fn releases_come_as_soon_as_they_are_certain() {
        let mut r = ListReader::new(vec!["get_weather".into()]);
        let mut out = Vec::new();
        r.push("[get_wea", &mut out).unwrap();
        assert_eq!((out.len(), r.unreleased()), (0, "[get_wea"));
        r.push("ther(city='Par", &mut out).unwrap();
        assert_eq!(
            out,
            [
                Frag::Start("get_weather".into()),
                Frag::Args("{\"city\":".into()),
                Frag::Args("\"".into()),
                Frag::Args("Par".into())
            ]
        );
        out.clear();
        r.push("is', n=12", &mut out).unwrap();
        assert_eq!(out, [Frag::Args("is".into()), Frag::Args("\"".into()), Frag::Args(",\"n\":".into())]);
        assert_eq!(r.unreleased(), "12");
        assert_eq!((r.started, r.closed), (1, 0));
        assert_eq!(r.end(), Err(Failed));
    }
}
