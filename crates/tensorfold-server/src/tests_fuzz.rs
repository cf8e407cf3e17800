//! Fuzz properties of the request side (proptest inside `cargo test`; `docs/fuzzing.md`): hostile completions
//! and chat bodies go through the parser, the validator, tools and the chat template to a request or a named 4xx,
//! never a panic; stop strings over detokenized pieces release exactly the text before the first stop.
use crate::api::{self, Params};
use crate::error::ApiError;
use crate::protocol::{ChatCompletionRequest, CompletionRequest};
use crate::stops::StopMatcher;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use serde_json::{Map, Value, json};
use std::path::PathBuf;
use std::sync::OnceLock;
use tensorfold_text::Text;

/// `cases` cases from a fixed seed, unless `PROPTEST_CASES` / `PROPTEST_RNG_SEED` say otherwise (the long run).
fn fuzz_config(cases: u32) -> Config {
    let mut c = Config { max_shrink_time: 60_000, ..Config::default() };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        c.rng_seed = RngSeed::Fixed(26);
    }
    c
}

/// The embedded default model's text, read from `models/`.
fn default_text() -> &'static Text {
    static TEXT: OnceLock<Text> = OnceLock::new();
    TEXT.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/lfm2-moe-pycode");
        Text::open(&dir).expect("the default model's text opens").expect("it has a tokenizer")
    })
}

/// Text with the pieces hostile bodies carry: special tokens, template syntax, multibyte and control characters.
fn hostile_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        prop::sample::select(vec![
            "<|im_end|>",
            "<|im_start|>system\n",
            "<|tool_call_start|>",
            "{{",
            "{%",
            "é",
            "世",
            "🙂",
            "\0",
            "\n",
            "\u{E000}",
            "\u{FFFD}",
            "def f(x):",
            " ",
            "get_weather",
            "[",
            "]",
            "(",
            "=",
        ])
        .prop_map(str::to_string),
        any::<String>().prop_map(|s| s.chars().take(6).collect()),
    ];
    prop::collection::vec(piece, 0..8).prop_map(|p| p.concat())
}

/// A JSON value of any type, numbers at the edges included.
fn hostile_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        prop::sample::select(vec![0i64, 1, -1, 2, 16, 17, 20, 21, 4096, i64::MAX, i64::MIN]).prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(json!(u64::MAX)),
        prop::sample::select(vec![0.0, -0.0, 0.5, 1.0, 2.0, 2.0001, 1e-300, 1e-45, 1e308, -1e308])
            .prop_map(Value::from),
        hostile_text().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::vec((hostile_key(), inner), 0..4).prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

/// Keys of the request bodies, and a few of their nested objects'.
fn hostile_key() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "prompt",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "include_usage",
        "logprobs",
        "top_logprobs",
        "n",
        "best_of",
        "model",
        "ignore_eos",
        "draft",
        "echo",
        "suffix",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "response_format",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "role",
        "content",
        "type",
        "text",
        "function",
        "name",
        "parameters",
        "arguments",
        "tool_calls",
        "tool_call_id",
        "json_schema",
        "schema",
        "regex",
        "unknown_field",
    ])
    .prop_map(str::to_string)
}

/// Values that are right for their field, so mutations reach past the first check.
fn plausible(key: &str) -> Value {
    let tool = json!({"type": "function", "function": {"name": "get_weather", "description": "weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}});
    match key {
        "messages" => {
            json!([{"role": "system", "content": "s"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}])
        }
        "tools" => json!([tool]),
        "tool_choice" => json!("required"),
        "response_format" => json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}),
        "logit_bias" => json!({"1": 5, "2": -100}),
        "stop" => json!(["\n", "def"]),
        "stream_options" => json!({"include_usage": true}),
        "prompt" => json!([[1, 2, 3]]),
        _ => json!(1),
    }
}

/// A mutated body: a valid one with fields replaced (hostile or plausible values), removed or added, and maybe
/// its bytes broken afterwards.
fn body(chat: bool) -> impl Strategy<Value = Vec<u8>> {
    let edit = (
        hostile_key(),
        prop_oneof![3 => hostile_value().prop_map(Some), 2 => Just(None), 1 => Just(Some(Value::Null))],
        any::<bool>(),
    );
    let breakage = prop_oneof![6 => Just(None), 1 => (any::<prop::sample::Index>(), any::<u8>()).prop_map(Some)];
    (prop::collection::vec(edit, 1..6), breakage, any::<bool>()).prop_map(move |(edits, broken, truncate)| {
        let mut v: Map<String, Value> = match chat {
            true => json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
            false => json!({"prompt": "def f(x):", "max_tokens": 4}),
        }
        .as_object()
        .cloned()
        .unwrap_or_default();
        for (key, value, remove) in edits {
            match value {
                Some(x) if !remove => v.insert(key, x),
                None if !remove => v.insert(key.clone(), plausible(&key)),
                _ => v.remove(&key),
            };
        }
        let mut bytes = Value::Object(v).to_string().into_bytes();
        if let Some((at, b)) = broken.filter(|_| !bytes.is_empty()) {
            let i = at.index(bytes.len());
            match truncate {
                true => bytes.truncate(i),
                false => bytes[i] = b,
            }
        }
        bytes
    })
}

/// A refusal is a client error that names what is wrong.
fn assert_refusal(e: &ApiError) -> Result<(), TestCaseError> {
    prop_assert!(e.status.is_client_error(), "{e:?}");
    prop_assert!(!e.message.is_empty(), "{e:?}");
    Ok(())
}

/// What validation promises of the parameters it lets through.
fn assert_params(p: &Params) -> Result<(), TestCaseError> {
    prop_assert!((0.0..=2.0).contains(&p.temperature), "{p:?}");
    prop_assert!(p.top_p > 0.0 && p.top_p <= 1.0, "{p:?}");
    prop_assert!((0.0..=1.0).contains(&p.min_p), "{p:?}");
    prop_assert!((1..=api::MAX_N as usize).contains(&p.n), "{p:?}");
    prop_assert!(p.max_tokens.is_none_or(|m| m >= 1), "{p:?}");
    prop_assert!(p.stop.len() <= 16 && p.stop.iter().all(|s| !s.is_empty() && s.len() <= 1024), "{p:?}");
    prop_assert!(p.logprobs.is_none_or(|n| n <= 20), "{p:?}");
    Ok(())
}

/// A chat body through everything the route runs before the engine: parse, validate, tools, template, tokenize.
fn chat_route(b: &[u8]) -> Result<Vec<u32>, ApiError> {
    let req: ChatCompletionRequest = api::request(b)?;
    let mut params = api::chat_params(&req)?;
    assert_params(&params).map_err(|e| ApiError::bad_request(format!("PROPERTY: {e}")))?;
    let msgs = api::messages(&req.messages)?;
    crate::tools::prepare(&mut params, default_text())?;
    let functions = params.tools.as_ref().map(|t| t.functions.clone());
    default_text()
        .encode_chat_with_tools(&msgs, true, functions.as_deref())
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

/// A completions body through parse, validate and the prompt.
fn completion_route(b: &[u8]) -> Result<api::Prompt, ApiError> {
    let req: CompletionRequest = api::request(b)?;
    let params = api::completion_params(&req)?;
    assert_params(&params).map_err(|e| ApiError::bad_request(format!("PROPERTY: {e}")))?;
    api::prompt(&req.prompt)
}

/// The reference for stop strings: after each piece, the first stop anywhere in the text so far ends the reply
/// at its start (the earliest one); with none by the end, everything.
fn reference(stops: &[String], pieces: &[String]) -> (String, bool) {
    let mut so_far = String::new();
    for p in pieces {
        so_far += p;
        if let Some(at) = stops.iter().filter_map(|s| so_far.find(s.as_str())).min() {
            return (so_far[..at].to_string(), true);
        }
    }
    (so_far, false)
}

/// Stop strings drawn from pieces of text the tokenizer makes (so they split across tokens) and hostile text.
fn stop_strings() -> impl Strategy<Value = Vec<String>> {
    let one = prop_oneof![
        hostile_text().prop_filter("non-empty", |s| !s.is_empty()),
        prop::sample::select(vec!["\n", "def", "return", " (", "é", "世界", "):\n", "  "]).prop_map(str::to_string),
    ];
    prop::collection::vec(one, 0..4)
}

proptest! {
    #![proptest_config(fuzz_config(192))]

    #[test]
    fn hostile_chat_bodies_are_run_or_refused_by_name(b in body(true)) {
        match chat_route(&b) {
            Ok(ids) => prop_assert!(!ids.is_empty()),
            Err(e) => {
                prop_assert!(!e.message.starts_with("PROPERTY"), "{}: {}", String::from_utf8_lossy(&b), e.message);
                assert_refusal(&e)?;
            }
        }
    }

    #[test]
    fn hostile_completions_bodies_are_run_or_refused_by_name(b in body(false)) {
        if let Err(e) = completion_route(&b) {
            prop_assert!(!e.message.starts_with("PROPERTY"), "{}: {}", String::from_utf8_lossy(&b), e.message);
            assert_refusal(&e)?;
        }
    }

    #[test]
    fn raw_bytes_are_refused_by_name(b in prop::collection::vec(any::<u8>(), 0..256)) {
        for r in [completion_route(&b).map(drop), chat_route(&b).map(drop)] {
            if let Err(e) = r {
                assert_refusal(&e)?;
            }
        }
    }

    #[test]
    fn stop_strings_over_detokenized_pieces_release_exactly_the_text_before_the_first_stop(
        ids in prop::collection::vec(0u32..8300, 0..40), stops in stop_strings(), text in hostile_text()
    ) {
        let t = default_text();
        // Pieces as a reply streams them: the detokenizer's over token ids, then arbitrary text split by chars.
        let mut d = t.detokenizer(true);
        let mut pieces: Vec<String> = ids.iter().filter_map(|&id| d.push(id).ok()).collect();
        pieces.push(d.finish());
        pieces.extend(text.chars().map(String::from));
        let mut m = StopMatcher::new(stops.clone());
        let (mut out, mut stopped) = (String::new(), false);
        for p in &pieces {
            let (released, stop) = m.push(p);
            out += &released;
            // Released text never holds a stop string.
            prop_assert!(stops.iter().all(|s| !out.contains(s.as_str())), "{out:?} {stops:?}");
            if stop {
                stopped = true;
                break;
            }
        }
        if !stopped {
            out += &m.finish();
        }
        prop_assert_eq!((out, stopped), reference(&stops, &pieces));
    }
}

/// The body mutations reach both outcomes on both routes, so the properties above test the validator and the
/// template, not only the JSON parser.
#[test]
fn the_body_mutations_reach_both_outcomes_on_both_routes() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::new(fuzz_config(1));
    for chat in [true, false] {
        let strategy = body(chat);
        let ok = (0..300)
            .filter(|_| {
                let b = strategy.new_tree(&mut runner).expect("a body").current();
                if chat { chat_route(&b).is_ok() } else { completion_route(&b).is_ok() }
            })
            .count();
        assert!((30..=270).contains(&ok), "chat {chat}: {ok} of 300 bodies accepted");
    }
}

/// Model output around tool calls: the markers, call-list syntax (names, keyword arguments, literals, brackets,
/// quotes, escapes) and arbitrary text.
fn tool_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        prop::sample::select(vec![
            crate::tools::split::CALL_START,
            crate::tools::split::CALL_END,
            "<|tool_call",
            "[",
            "]",
            "(",
            ")",
            "{",
            "}",
            "get_weather",
            "now",
            "city=",
            "\"Paris\"",
            "'x\\'y'",
            "1e400",
            "-0",
            "True",
            "None",
            "null",
            ", ",
            ":",
            "\"name\": \"now\"",
            "\"arguments\": {}",
            "\\u00e9",
            "é",
            "\n",
            "<|tool_call_start|>[get_weather(city=\"Paris\"), now()]<|tool_call_end|>",
            "<|tool_call_start|>[{\"name\": \"now\", \"arguments\": {\"a\": [1, {\"b\": null}]}}]<|tool_call_end|>",
        ])
        .prop_map(str::to_string),
        any::<String>().prop_map(|s| s.chars().take(4).collect()),
        (1usize..80).prop_map(|n| "[".repeat(n)),
    ];
    prop::collection::vec(piece, 0..24).prop_map(|p| p.concat())
}

/// The splitter's output with adjacent text merged and call ids dropped (they are random).
fn split_all(pieces: &[&str]) -> Vec<(String, Vec<(String, String)>)> {
    use crate::tools::split::{Out, Splitter};
    let mut s = Splitter::new(vec!["get_weather".into(), "now".into()]);
    let mut outs: Vec<Out> = pieces.iter().flat_map(|p| s.push(p)).collect();
    outs.extend(s.finish());
    let mut merged: Vec<(String, Vec<(String, String)>)> = vec![];
    for o in outs {
        match o {
            Out::Text(t) => match merged.last_mut() {
                Some((text, calls)) if calls.is_empty() => *text += &t,
                _ => merged.push((t, vec![])),
            },
            Out::Calls(c) => {
                let calls = c.into_iter().map(|c| (c.function.name, c.function.arguments)).collect();
                merged.push((String::new(), calls));
            }
            // Only a live splitter (`Splitter::live`) streams a call's name and argument fragments.
            Out::Start(_) | Out::Args(_) => panic!("a whole-list splitter streamed a call fragment: {o:?}"),
        }
    }
    merged
}

proptest! {
    #![proptest_config(fuzz_config(256))]

    #[test]
    fn tool_calls_read_the_same_whatever_the_pieces_and_text_round_trips(
        text in tool_text(), cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..8)
    ) {
        // The bounded literal reader refuses by name, whatever the text (deep nesting included).
        let _ = crate::tools::pyliteral::parse_calls(&text);
        let mut at: Vec<usize> = cuts.iter().map(|i| i.index(text.len() + 1)).filter(|&i| text.is_char_boundary(i)).collect();
        at.extend([0, text.len()]);
        at.sort_unstable();
        at.dedup();
        let pieces: Vec<&str> = at.windows(2).map(|w| &text[w[0]..w[1]]).collect();
        let whole = split_all(&[&text]);
        prop_assert_eq!(&split_all(&pieces), &whole);
        // Without calls read, the content is the text as it was, markers included.
        if whole.iter().all(|(_, c)| c.is_empty()) {
            prop_assert_eq!(whole.into_iter().map(|(t, _)| t).collect::<String>(), text);
        }
    }
}

/// The generated model output reads as calls often enough for the property above to test the reader.
#[test]
fn the_tool_texts_read_as_calls_in_some_cases_and_as_text_in_others() {
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::new(fuzz_config(1));
    let strategy = tool_text();
    let with_calls = (0..300)
        .filter(|_| {
            let text = strategy.new_tree(&mut runner).expect("a text").current();
            split_all(&[&text]).iter().any(|(_, c)| !c.is_empty())
        })
        .count();
    assert!((15..=285).contains(&with_calls), "{with_calls} of 300 texts read as calls");
}
