//! Structured output over HTTP: `response_format` json_schema and vLLM's `structured_outputs.regex` constrain the
//! reply (drafted equals `draft: false`), and a schema or regex llguidance cannot compile, two constraints at once
//! or a malformed `response_format` are 400s naming the field.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn constrained_replies_follow_their_grammar_and_drafting_changes_no_token() {
    let s = start(Setup::default()).await;
    let schema = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
                        "additionalProperties": false});
    let body = with(
        &chat("Answer in JSON.", 40),
        json!({"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema, "strict": true}},
               "structured_outputs": null}),
    );
    let r = s.post(CHAT, &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let plain = s.post(CHAT, &with(&body, json!({"draft": false}))).await;
    assert_eq!(sha_of(&r.json), sha_of(&plain.json));
    let text = text_of(&r.json);
    let start: String = text.chars().filter(|c| !c.is_whitespace()).take(6).collect();
    assert!(start.starts_with("{\"ok\":") || text.trim().is_empty(), "{text:?}");
    if r.json["choices"][0]["finish_reason"] == "stop" {
        let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(v["ok"].is_boolean(), "{v}");
    }
    let rx = with(
        &completion("Code:", 20),
        json!({"structured_outputs": {"regex": "[A-Z]{2}-[0-9]{3}"}, "temperature": 0.7, "seed": 2}),
    );
    let r = s.post(COMPLETIONS, &rx).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let t = text_of(&r.json);
    assert_eq!(r.json["choices"][0]["finish_reason"], "stop", "the grammar's end stops the reply: {t:?}");
    assert!(t.len() == 6 && t[..2].chars().all(|c| c.is_ascii_uppercase()) && &t[2..3] == "-", "{t:?}");
    let st = s.stream(COMPLETIONS, &with(&rx, json!({"stream": true}))).await;
    assert_eq!(st.text(), t);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_constraints_are_named_400s() {
    let s = start(Setup::default()).await;
    let c = completion("Hello", 4);
    for (patch, param, says) in [
        (json!({"structured_outputs": {"regex": "(unclosed"}}), "structured_outputs", "cannot be compiled"),
        (json!({"guided_grammar": "start: nowhere"}), "guided_grammar", "cannot be compiled"),
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"schema": {"$ref": "#/x"}}}}),
            "response_format",
            "cannot be compiled",
        ),
        (json!({"response_format": {"type": "json_schema"}}), "response_format", "required"),
        (json!({"response_format": {"type": "yaml"}}), "response_format", "not supported"),
        (json!({"guided_regex": "a", "structured_outputs": {"regex": "b"}}), "guided_regex", "one constraint"),
        (json!({"structured_outputs": {"choice": ["a"]}}), "structured_outputs", "not supported"),
    ] {
        let r = s.post(COMPLETIONS, &with(&c, patch.clone())).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{patch}: {}", r.text);
        assert_eq!(r.json["error"]["param"], param, "{patch}: {}", r.text);
        assert!(r.json["error"]["message"].as_str().unwrap_or("").contains(says), "{patch}: {}", r.text);
    }
}
