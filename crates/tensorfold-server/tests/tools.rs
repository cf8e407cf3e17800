//! Tool calling over HTTP: `tool_choice: "required"` (and a named function) constrain the embedded code model to a
//! parsed call whose arguments are JSON matching the tool's schema, `finish_reason: "tool_calls"`, drafted equal to
//! `draft: false`, streamed as tool-call deltas (a call's name, then its arguments in fragments); `auto` and `none` answer as before; bad tools and history are
//! named 400s.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

fn weather_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Current weather of a city.",
         "parameters": {"type": "object", "properties": {
             "city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
             "days": {"type": "integer", "minimum": 1, "maximum": 7}},
             "required": ["city"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "now", "description": "The time.", "parameters": {"type": "object"}}}
    ])
}

fn tool_chat(choice: Value) -> Value {
    with(
        &chat("What is the weather in Paris?", 48),
        json!({"tools": weather_tools(), "tool_choice": choice, "ignore_eos": null}),
    )
}

/// The parsed arguments of a `get_weather` call, checked against its schema.
fn check_weather(call: &Value) {
    assert_eq!(call["type"], "function");
    assert!(call["id"].as_str().is_some_and(|id| id.starts_with("call_") && id.len() > 10), "{call}");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().expect("arguments text")).expect("JSON");
    let o = args.as_object().expect("an object");
    assert!(["Paris", "Oslo", "Lima"].contains(&o["city"].as_str().expect("city")), "{args}");
    assert!(o.keys().all(|k| k == "city" || k == "days"), "{args}");
    if let Some(d) = o.get("days") {
        assert!((1..=7).contains(&d.as_i64().expect("an integer")), "{args}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn required_and_named_choices_return_parsed_calls() {
    let s = start(Setup::default()).await;
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let r = s.post(CHAT, &tool_chat(named.clone())).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let choice = &r.json["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{}", r.text);
    let calls = choice["message"]["tool_calls"].as_array().expect("tool_calls");
    assert!(!calls.is_empty());
    calls.iter().for_each(check_weather);
    assert!(calls.iter().all(|c| c["function"]["name"] == "get_weather"));
    let plain = s.post(CHAT, &with(&tool_chat(named.clone()), json!({"draft": false}))).await;
    assert_eq!(sha_of(&r.json), sha_of(&plain.json), "drafting changes no token of a constrained call");

    let req = s.post(CHAT, &with(&tool_chat(json!("required")), json!({"parallel_tool_calls": false}))).await;
    assert_eq!(req.status, StatusCode::OK, "{}", req.text);
    let calls = req.json["choices"][0]["message"]["tool_calls"].as_array().expect("tool_calls").clone();
    assert_eq!(calls.len(), 1, "parallel_tool_calls false: one call");
    match calls[0]["function"]["name"].as_str() {
        Some("get_weather") => check_weather(&calls[0]),
        Some("now") => assert!(
            serde_json::from_str::<Value>(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap().is_object()
        ),
        other => panic!("a call of an offered tool: {other:?}"),
    }

    // Streamed: the same calls, announced then their arguments in fragments, no content.
    let st = s.stream(CHAT, &with(&tool_chat(named), json!({"stream": true}))).await;
    assert_eq!(st.finish_reason(), "tool_calls");
    assert_eq!(st.token_sha256(), sha_of(&r.json));
    let whole = r.json["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    let streamed = st.tool_calls(0);
    assert_eq!(streamed.len(), whole.len());
    for (s, w) in streamed.iter().zip(whole) {
        assert_eq!(s["function"], w["function"]);
    }
    let deltas = st.tool_call_deltas(0);
    assert!(deltas.len() > whole.len(), "arguments come in fragments: {deltas:?}");
    assert_eq!(st.text(), "", "a constrained call has no content");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_and_none_answer_text_and_history_tool_messages_render() {
    let s = start(Setup::default()).await;
    for choice in [json!("auto"), json!("none")] {
        let r = s.post(CHAT, &with(&tool_chat(choice), json!({"ignore_eos": true, "max_tokens": 8}))).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert!(r.json["choices"][0]["message"]["content"].is_string(), "{}", r.text);
    }
    let history = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "22C, sunny"},
    ]);
    let r = s.post(CHAT, &with(&tool_chat(json!("auto")), json!({"messages": history, "max_tokens": 4}))).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_tool_requests_are_named_400s() {
    let s = start(Setup::default()).await;
    let base = tool_chat(json!("auto"));
    let bad_fn = |f: Value| json!([{"type": "function", "function": f}]);
    for (patch, param, says) in [
        (json!({"tools": bad_fn(json!({"name": "has space"}))}), "tools[0].function.name", "must match"),
        (
            json!({"tools": bad_fn(json!({"name": "f", "parameters": {"type": "array"}}))}),
            "tools[0].function.parameters",
            "object",
        ),
        (json!({"tools": [weather_tools()[0], weather_tools()[0]]}), "tools[1].function.name", "twice"),
        (json!({"tools": "get_weather"}), "tools", "list"),
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
            "not one of the `tools`",
        ),
        (json!({"tool_choice": "sometimes"}), "tool_choice", "not one of"),
        (json!({"tools": null, "tool_choice": "required"}), "tool_choice", "only allowed when `tools`"),
        (
            json!({"tool_choice": "required", "response_format": {"type": "json_object"}}),
            "tool_choice",
            "one constraint",
        ),
        (
            json!({"tools": bad_fn(json!({"name": "f", "parameters": {"properties": {"x": false}, "required": ["x"]}})),
                   "tool_choice": "required"}),
            "tool_choice",
            "admits no value",
        ),
        (json!({"parallel_tool_calls": "yes"}), "parallel_tool_calls", "true or false"),
        (
            json!({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{x"}}]}]}),
            "messages[0].tool_calls[0].function.arguments",
            "JSON",
        ),
        (
            json!({"messages": [{"role": "tool", "content": "x", "tool_call_id": 7}]}),
            "messages[0].tool_call_id",
            "string",
        ),
    ] {
        let r = s.post(CHAT, &with(&base, patch.clone())).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{patch}: {}", r.text);
        assert_error_object(&r, &patch.to_string());
        assert_eq!(r.json["error"]["param"], param, "{patch}: {}", r.text);
        assert!(r.json["error"]["message"].as_str().unwrap().contains(says), "{patch}: {}", r.text);
    }
    let r = s.post(COMPLETIONS, &with(&completion("x", 2), json!({"tools": weather_tools()}))).await;
    assert_eq!((r.status, r.json["error"]["param"].as_str()), (StatusCode::BAD_REQUEST, Some("tools")), "{}", r.text);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_n_choices_each_choice_reads_its_own_calls_whole_and_streamed() {
    let s = start(Setup::default()).await;
    // A named `now` (no arguments) so that lists of several calls fit; `get_weather` is offered beside it.
    let body = with(
        &tool_chat(json!({"type": "function", "function": {"name": "now"}})),
        json!({"n": 3, "temperature": 1.0, "seed": 21, "max_tokens": 200, "parallel_tool_calls": true}),
    );
    let r = s.post(CHAT, &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let choices = r.json["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 3);
    let st = s.stream(CHAT, &with(&body, json!({"stream": true}))).await;
    assert!(st.done);
    let mut counts = Vec::new();
    for (i, c) in choices.iter().enumerate() {
        assert_eq!((c["index"].clone(), c["finish_reason"].as_str()), (json!(i), Some("tool_calls")), "{c}");
        let calls = c["message"]["tool_calls"].as_array().expect("tool_calls");
        // Choice i is the request alone with seed 21 + i: the same calls.
        let alone = s.post(CHAT, &with(&body, json!({"n": 1, "seed": 21 + i}))).await;
        let alone_calls = alone.json["choices"][0]["message"]["tool_calls"].as_array().expect("tool_calls").clone();
        let functions = |l: &[Value]| l.iter().map(|c| c["function"].clone()).collect::<Vec<_>>();
        assert_eq!(functions(calls), functions(&alone_calls), "choice {i}");
        // Streamed: the choice's own deltas, indexed from 0 within it, join to the same calls.
        assert_eq!(functions(&st.tool_calls(i)), functions(calls), "choice {i} streamed");
        let finish: Vec<&Value> = st
            .chunks
            .iter()
            .filter_map(|ch| ch["choices"].get(0).filter(|x| x["index"] == i && !x["finish_reason"].is_null()))
            .collect();
        assert_eq!(finish.len(), 1, "choice {i}: one finish chunk");
        assert_eq!(finish[0]["finish_reason"], "tool_calls");
        counts.push(calls.len());
    }
    assert!(
        counts.iter().any(|&n| n > 1),
        "some choice makes several calls, so indexes past 0 are checked: {counts:?}"
    );
}
