//! The bounds of a forced tool call, through llguidance on the fixture tokenizer and model: a string argument
//! (top level, in a list, in an any-value, behind a `$ref`) takes at most `max_string` characters, a parallel list
//! at most `max_calls` calls; a sampled forced call on the fixture model closes within a few tokens of the cap
//! instead of running to `max_tokens`; the served caps compile quickly.

mod common;

use serde_json::{Value, json};
use tensorfold_engine::core::EngineConfig;
use tensorfold_engine::keyed::SamplingParams;
use tensorfold_engine::tool_bounds::{MAX_CALLS, MAX_STRING_CHARS};
use tensorfold_engine::tool_grammar::{ToolCallForm, ToolConstraint, ToolSpec, tool_call_spec};
use tensorfold_engine::{Grammar, GrammarSpec, ModelTarget, Request};
use tensorfold_kernels::CpuBackend;
use tensorfold_model::Source;
use tensorfold_text::Text;

fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

fn text() -> Text {
    Text::open(&root().join("lfm2-moe-f32")).expect("opens").expect("a tokenizer")
}

fn compile(t: &Text, spec: &GrammarSpec) -> Grammar {
    Grammar::compile(&t.grammar_env().expect("a grammar env").factory, spec).expect("compiles")
}

/// Whether `spec` takes the whole of `s` (markers as their special tokens) and is then complete.
fn takes(t: &Text, spec: &GrammarSpec, s: &str) -> bool {
    let mut g = compile(t, spec);
    let ids = t.encode(s, false).expect("encodes");
    ids.iter().all(|&id| g.accept(id).is_ok()) && g.is_done()
}

fn constraint(tools: Vec<ToolSpec>, form: ToolCallForm, max_string: usize, max_calls: usize) -> ToolConstraint {
    ToolConstraint {
        tools,
        parallel: true,
        form,
        markers: ("<|tool_call_start|>".into(), "<|tool_call_end|>".into()),
        special_markers: true,
        max_string,
        max_calls,
    }
}

fn note_tool() -> ToolSpec {
    ToolSpec {
        name: "note".into(),
        parameters: json!({"type": "object", "$defs": {"Tag": {"type": "object", "properties": {"t": {"type": "string"}},
                                                                "required": ["t"], "additionalProperties": false}},
            "properties": {"text": {"type": "string"}, "list": {"type": "array", "items": {"type": "string"}},
                           "any": {}, "tag": {"$ref": "#/$defs/Tag"}},
            "required": ["text"]}),
    }
}

fn call(inner: &str) -> String {
    format!("<|tool_call_start|>[{inner}]<|tool_call_end|>")
}

#[test]
fn strings_past_the_cap_and_calls_past_the_cap_are_refused() {
    let t = text();
    let spec = tool_call_spec(&constraint(vec![note_tool()], ToolCallForm::Pythonic, 5, 3)).expect("a grammar");
    for ok in [
        r#"note(text="abcde")"#,
        r#"note(text="", list=["abcde", "x"])"#,
        r#"note(text="a", any={"k": ["abcde"]})"#,
        r#"note(text="a", tag={"t": "abcde"})"#,
        r#"note(text="a"), note(text="b"), note(text="c")"#,
    ] {
        assert!(takes(&t, &spec, &call(ok)), "refused {ok}");
    }
    for bad in [
        r#"note(text="abcdef")"#,
        r#"note(text="", list=["abcdef"])"#,
        r#"note(text="a", any={"k": ["abcdef"]})"#,
        r#"note(text="a", any="abcdef")"#,
        r#"note(text="a", tag={"t": "abcdef"})"#,
        r#"note(text="a"), note(text="b"), note(text="c"), note(text="d")"#,
    ] {
        assert!(!takes(&t, &spec, &call(bad)), "admitted {bad}");
    }
    // The JSON form: the same cap inside the call object.
    let json_form = tool_call_spec(&constraint(vec![note_tool()], ToolCallForm::Json, 5, 1)).expect("a grammar");
    assert!(takes(&t, &json_form, &call(r#"{"name": "note", "arguments": {"text": "abcde"}}"#)));
    assert!(!takes(&t, &json_form, &call(r#"{"name": "note", "arguments": {"text": "abcdef"}}"#)));
    assert!(!takes(
        &t,
        &json_form,
        &call(r#"{"name": "note", "arguments": {"text": "a"}}, {"name": "note", "arguments": {"text": "b"}}"#)
    ));
}

#[test]
fn a_sampled_forced_call_closes_at_the_cap_and_the_served_caps_compile_quickly() {
    let t = text();
    let tools = vec![ToolSpec {
        name: "note".into(),
        parameters: json!({"properties": {"text": {"type": "string"}}, "required": ["text"]}),
    }];
    let spec = tool_call_spec(&constraint(tools.clone(), ToolCallForm::Pythonic, 6, 1)).expect("a grammar");
    let mut l = tensorfold_model::open(&Source::Dir(root().join("lfm2-moe-f32")), CpuBackend).expect("target");
    l.model.drafter = None;
    let target = ModelTarget { model: std::sync::Arc::new(l.model), eos: l.eos_ids };
    let reqs: Vec<Request> = (0..4u64)
        .map(|i| Request {
            params: SamplingParams { temperature: 1.5, seed: 11 + i, ..SamplingParams::greedy() },
            ignore_eos: true,
            grammar: Some(compile(&t, &spec)),
            draft: false,
            ..Request::greedy(t.encode(&format!("Note {i}: "), true).expect("encodes"), 200)
        })
        .collect();
    let (replies, _) = common::run_all(target, EngineConfig::default(), &reqs);
    for r in &replies {
        let text = t.decode(r, false).expect("decodes");
        assert!(r.len() < 200, "the call closed before max_tokens: {text:?}");
        let inner =
            text.strip_prefix("<|tool_call_start|>[note(text=").and_then(|x| x.strip_suffix(")]<|tool_call_end|>"));
        let v: Value = serde_json::from_str(inner.unwrap_or_else(|| panic!("{text:?}"))).expect("a JSON string");
        assert!(v.as_str().is_some_and(|s| s.chars().count() <= 6), "{text:?}");
    }
    let started = std::time::Instant::now();
    let served = constraint(vec![note_tool(), tools[0].clone()], ToolCallForm::Pythonic, MAX_STRING_CHARS, MAX_CALLS);
    let g = compile(&t, &tool_call_spec(&served).expect("a grammar"));
    drop(g);
    assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
}
