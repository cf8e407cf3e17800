//! Structured output in the lane core, on the fixture model and its tokenizer: a constrained reply follows its
//! grammar (a regex, a JSON schema, a tool call) and stops when the grammar is complete; a drafted constrained reply
//! equals its `draft: false` reply and the solo loop token for token (context copies and held block drafts, greedy
//! and sampled); concurrent equals alone; a grammar llguidance cannot compile is refused with its reason. A forced
//! tool call is bounded: a string argument (top level, in a list, in an any-value, behind a `$ref`) takes at most
//! `max_string` characters, a parallel list at most `max_calls` calls, so a sampled forced call closes at the cap
//! instead of running to `max_tokens`; the served caps compile quickly.

mod common;

use serde_json::Value;
use serde_json::json;
use tensorfold_engine::core::EngineConfig;
use tensorfold_engine::keyed::SamplingParams;
use tensorfold_engine::single::{GenerateOptions, generate};
use tensorfold_engine::tool_bounds::{self, MAX_CALLS, MAX_STRING_CHARS};
use tensorfold_engine::tool_grammar::{ToolCallForm, ToolConstraint, ToolSpec, tool_call_spec};
use tensorfold_engine::{Grammar, GrammarSpec, ModelTarget, Penalties, Request};
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

fn target() -> ModelTarget<CpuBackend> {
    let mut l = tensorfold_model::open(&Source::Dir(root().join("lfm2-moe-f32")), CpuBackend).expect("target");
    let d = tensorfold_model::drafter::open_drafter(
        &Source::Dir(root().join("dspark-tiny")),
        &l.model.cfg,
        &l.model.backend,
    )
    .expect("drafter");
    l.model.drafter = Some(d);
    ModelTarget { model: std::sync::Arc::new(l.model), eos: l.eos_ids }
}

fn cfg(copy_min: usize) -> EngineConfig {
    EngineConfig {
        copy_min,
        max_draft: 6,
        round_rows: 40,
        prefill_chunk: 8,
        round_guard: false,
        ..EngineConfig::default()
    }
}

/// Requests under `g`, greedy and sampled, one with a repetition penalty too.
fn requests(t: &Text, spec: &GrammarSpec) -> Vec<Request> {
    (0..4u64)
        .map(|i| {
            let prompt = t.encode(&format!("Example {i}: "), true).expect("encodes");
            Request {
                params: SamplingParams {
                    temperature: if i % 2 == 0 { 0.0 } else { 0.8 },
                    seed: 3 + i,
                    ..SamplingParams::greedy()
                },
                ignore_eos: true,
                penalties: if i == 3 {
                    Penalties { repetition: 1.2, ..Penalties::default() }
                } else {
                    Penalties::default()
                },
                grammar: Some(compile(t, spec)),
                ..Request::greedy(prompt, 72)
            }
        })
        .collect()
}

/// Runs `reqs` every way that must agree: the solo loop, plain, context copies, held block drafts, all at once.
fn all_ways(reqs: &[Request]) -> Vec<Vec<u32>> {
    let t = target();
    let solo: Vec<Vec<u32>> = reqs
        .iter()
        .map(|r| {
            let opts = GenerateOptions {
                chunk: 8,
                max_tokens: r.max_tokens,
                context: 4096,
                stop_ids: Vec::new(),
                params: r.params,
                penalties: r.penalties.clone(),
                grammar: r.grammar.clone(),
                drafts: None,
            };
            generate(&t.model, &r.prompt, &opts, |_| true).expect("solo runs").0
        })
        .collect();
    let plain: Vec<Request> = reqs.iter().map(|r| Request { draft: false, ..r.clone() }).collect();
    let (undrafted, _) = common::run_all(t.clone(), cfg(2), &plain);
    let (copies, _) = common::run_all(t.clone(), cfg(2), reqs);
    let (blocks, stats) = common::run_all(t.clone(), cfg(0), reqs);
    for i in 0..reqs.len() {
        assert_eq!(undrafted[i], solo[i], "request {i}: plain vs solo loop");
        assert_eq!(copies[i], solo[i], "request {i}: copy drafts vs solo loop");
        assert_eq!(blocks[i], solo[i], "request {i}: block drafts vs solo loop");
        let (alone, _) = common::run_all(t.clone(), cfg(0), std::slice::from_ref(&reqs[i]));
        assert_eq!(alone[0], solo[i], "request {i}: alone vs beside the others");
    }
    let d: usize = stats.iter().map(|s| s.drafted).sum();
    assert!(d > 0, "block drafts were verified");
    solo
}

#[test]
fn a_regex_constrained_reply_matches_it_stops_at_its_end_and_drafting_changes_no_token() {
    let t = text();
    let spec = GrammarSpec::Regex("[a-z]{3,8}-[0-9]{2,3}!".into());
    let replies = all_ways(&requests(&t, &spec));
    for (i, r) in replies.iter().enumerate() {
        let s = t.decode(r, false).expect("decodes");
        let (word, rest) = s.split_once('-').unwrap_or_else(|| panic!("request {i}: {s:?}"));
        let digits = rest.strip_suffix('!').unwrap_or_else(|| panic!("request {i} ends at the grammar's end: {s:?}"));
        assert!((3..=8).contains(&word.len()) && word.chars().all(|c| c.is_ascii_lowercase()), "{s:?}");
        assert!((2..=3).contains(&digits.len()) && digits.chars().all(|c| c.is_ascii_digit()), "{s:?}");
    }
    // The mask is applied: unconstrained replies are not of that shape.
    let free: Vec<Request> = requests(&t, &spec).into_iter().map(|r| Request { grammar: None, ..r }).collect();
    let (free, _) = common::run_all(target(), cfg(2), &free);
    assert!(free.iter().zip(&replies).all(|(a, b)| a != b));
}

#[test]
fn a_json_schema_reply_parses_under_the_schema() {
    let t = text();
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"enum": [1, 2, 3]}},
                        "required": ["ok", "n"], "additionalProperties": false});
    let replies = all_ways(&requests(&t, &GrammarSpec::JsonSchema(tensorfold_engine::grammar::compact(schema))));
    for r in replies {
        let s = t.decode(&r, false).expect("decodes");
        let v: serde_json::Value = serde_json::from_str(&s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        assert!(v["ok"].is_boolean() && [1, 2, 3].contains(&v["n"].as_i64().unwrap_or(0)), "{s}");
        assert_eq!(v.as_object().map(|o| o.len()), Some(2), "{s}");
    }
}

#[test]
fn a_required_tool_call_is_a_call_of_an_offered_tool() {
    let t = text();
    let tools = vec![
        ToolSpec {
            name: "get_weather".into(),
            parameters: json!({"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                                "required": ["city"], "additionalProperties": false}),
        },
        ToolSpec { name: "now".into(), parameters: serde_json::Value::Null },
    ];
    for form in [ToolCallForm::Pythonic, ToolCallForm::Json] {
        let c = ToolConstraint {
            tools: tools.clone(),
            parallel: false,
            form,
            markers: ("<|tool_call_start|>".into(), "<|tool_call_end|>".into()),
            special_markers: true,
            max_string: tool_bounds::MAX_STRING_CHARS,
            max_calls: tool_bounds::MAX_CALLS,
        };
        let spec = tool_call_spec(&c).expect("a grammar");
        let start = t.token_to_id("<|tool_call_start|>").expect("a special token");
        for r in all_ways(&requests(&t, &spec)) {
            assert_eq!(r[0], start, "the call list opens with the special token: {r:?}");
            let s = t.decode(&r, false).expect("decodes");
            let inner = s.strip_prefix("<|tool_call_start|>[").and_then(|x| x.strip_suffix("]<|tool_call_end|>"));
            let inner = inner.unwrap_or_else(|| panic!("{form:?}: {s:?}"));
            match form {
                ToolCallForm::Pythonic => assert!(
                    inner == "now()" || ["Paris", "Oslo"].iter().any(|c| inner == format!("get_weather(city=\"{c}\")")),
                    "{s}"
                ),
                ToolCallForm::Json => {
                    let v: serde_json::Value = serde_json::from_str(inner).unwrap_or_else(|e| panic!("{s:?}: {e}"));
                    assert!(["get_weather", "now"].contains(&v["name"].as_str().unwrap_or("")), "{s}");
                }
            }
        }
    }
}

/// Whether `g` takes the whole of `s` (tokenized by `t`, markers as their special tokens) and is then complete.
fn takes(t: &Text, spec: &GrammarSpec, s: &str) -> bool {
    let mut g = compile(t, spec);
    let ids = t.encode(s, false).expect("encodes");
    ids.iter().all(|&id| g.accept(id).is_ok()) && g.is_done()
}

#[test]
fn a_forced_call_admits_only_calls_with_every_required_argument() {
    let t = text();
    let tools = vec![
        ToolSpec {
            name: "book".into(),
            parameters: json!({"type": "object", "properties": {"seats": {"type": "integer"},
                "city": {"type": "string"}, "window": {"type": "boolean"}}, "required": ["city"]}),
        },
        ToolSpec { name: "ping".into(), parameters: json!({"properties": {"a": {"type": "integer"}, "b": {}}}) },
    ];
    let c = |parallel| ToolConstraint {
        tools: tools.clone(),
        parallel,
        form: ToolCallForm::Pythonic,
        markers: ("<|tool_call_start|>".into(), "<|tool_call_end|>".into()),
        special_markers: true,
        max_string: tool_bounds::MAX_STRING_CHARS,
        max_calls: tool_bounds::MAX_CALLS,
    };
    let one = tool_call_spec(&c(false)).expect("a grammar");
    let call = |inner: &str| format!("<|tool_call_start|>[{inner}]<|tool_call_end|>");
    for ok in [
        "book(city=\"Oslo\")",
        "book(seats=2, city=\"Oslo\")",
        "book(city=\"Oslo\", window=true)",
        "book(seats=2, city=\"Oslo\", window=false)",
        "ping()",
        "ping(a=1)",
        "ping(b=[1, \"x\"])",
        "ping(a=1, b=null)",
    ] {
        assert!(takes(&t, &one, &call(ok)), "refused {ok}");
    }
    for bad in [
        "book()",
        "book(seats=2)",
        "book(window=true)",
        "book(seats=2, window=true)",
        "book(city=\"Oslo\", city=\"Rome\")",
        "book(city=\"Oslo\", seats=2)",
        "book(city=3)",
        "book(city=\"Oslo\", color=\"red\")",
        "ping(a=1, a=2)",
        "ping(b=1, a=2)",
        "ping(a=\"x\")",
        "nope()",
        "ping(), ping()",
    ] {
        assert!(!takes(&t, &one, &call(bad)), "admitted {bad}");
    }
    assert!(!takes(&t, &one, "ping()"), "the markers are required");
    let many = tool_call_spec(&c(true)).expect("a grammar");
    assert!(takes(&t, &many, &call("ping(), book(city=\"Oslo\")")));
    assert!(!takes(&t, &many, &call("ping(), book(seats=1)")));
    // A named choice is the constraint over that one tool.
    let named = ToolConstraint { tools: tools[..1].to_vec(), ..c(false) };
    let named = tool_call_spec(&named).expect("a grammar");
    assert!(takes(&t, &named, &call("book(city=\"Oslo\")")));
    assert!(!takes(&t, &named, &call("ping()")));
    // A key the call reader cannot take as a keyword: that tool is called in the JSON form, `required` kept.
    let spaced = vec![ToolSpec {
        name: "who".into(),
        parameters: json!({"properties": {"first name": {"type": "string"}}, "required": ["first name"]}),
    }];
    let spaced = tool_call_spec(&ToolConstraint { tools: spaced, ..c(false) }).expect("a grammar");
    assert!(takes(&t, &spaced, &call("{\"name\": \"who\", \"arguments\": {\"first name\": \"Ada\"}}")));
    assert!(!takes(&t, &spaced, &call("{\"name\": \"who\", \"arguments\": {}}")));
}

#[test]
fn a_grammar_llguidance_cannot_compile_is_refused_with_its_reason() {
    let t = text();
    let env = t.grammar_env().expect("env");
    for (spec, says) in [
        (GrammarSpec::Regex("(unclosed".into()), "regex"),
        (GrammarSpec::Lark("start: missing_rule".into()), "grammar"),
        (GrammarSpec::JsonSchema(json!({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}})), "JSON schema"),
    ] {
        let e = Grammar::compile(&env.factory, &spec).expect_err("refused");
        assert!(e.to_string().contains(says) && e.why.len() > 5, "{e}");
    }
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
