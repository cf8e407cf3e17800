//! The bad-request table: every client mistake gets its 4xx and an OpenAI error object, while a stream runs
//! undisturbed beside it.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// A row of the bad-request table.
struct Bad {
    what: &'static str,
    route: &'static str,
    body: Value,
    status: u16,
    kind: &'static str,
    param: Option<&'static str>,
    code: Option<&'static str>,
    says: &'static str,
}

fn bad(what: &'static str, route: &'static str, body: Value, status: u16, param: Option<&'static str>) -> Bad {
    Bad { what, route, body, status, kind: "invalid_request_error", param, code: None, says: "" }
}

fn table() -> Vec<Bad> {
    let c = completion("Hello", 4);
    let m = chat("Hello", 4);
    let ids = |n: usize| json!((0..n).map(|i| 10 + (i % 400) as u32).collect::<Vec<_>>());
    let mut t = vec![
        // The body itself.
        Bad { says: "invalid JSON", ..bad("invalid JSON", COMPLETIONS, json!("{\"prompt\": "), 400, None) },
        Bad { says: "JSON object", ..bad("a JSON list", CHAT, json!([1, 2]), 400, None) },
        // Required fields.
        Bad {
            says: "required",
            ..bad("no prompt", COMPLETIONS, with(&c, json!({"prompt": null})), 400, Some("prompt"))
        },
        Bad {
            says: "required",
            ..bad("no messages", CHAT, with(&m, json!({"messages": null})), 400, Some("messages"))
        },
        Bad {
            says: "must not be empty",
            ..bad("empty messages", CHAT, with(&m, json!({"messages": []})), 400, Some("messages"))
        },
        Bad {
            says: "must be a list",
            ..bad("messages a string", CHAT, with(&m, json!({"messages": "hi"})), 400, Some("messages"))
        },
        Bad {
            says: "unknown role \"wizard\"",
            ..bad(
                "unknown role",
                CHAT,
                with(&m, json!({"messages": [{"role": "wizard", "content": "hi"}]})),
                400,
                Some("messages[0].role"),
            )
        },
        bad(
            "no role",
            CHAT,
            with(&m, json!({"messages": [{"role": "user", "content": "a"}, {"content": "hi"}]})),
            400,
            Some("messages[1].role"),
        ),
        bad(
            "content a number",
            CHAT,
            with(&m, json!({"messages": [{"role": "user", "content": 5}]})),
            400,
            Some("messages[0].content"),
        ),
        bad(
            "an image part",
            CHAT,
            with(
                &m,
                json!({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}),
            ),
            400,
            Some("messages[0].content"),
        ),
        bad("a message not an object", CHAT, with(&m, json!({"messages": ["hi"]})), 400, Some("messages[0]")),
        // Prompts.
        Bad {
            says: "zero tokens",
            ..bad("a zero-token text prompt", COMPLETIONS, with(&c, json!({"prompt": ""})), 400, Some("prompt"))
        },
        Bad {
            says: "zero tokens",
            ..bad("an empty id list", COMPLETIONS, with(&c, json!({"prompt": []})), 400, Some("prompt"))
        },
        Bad {
            says: "prompt token id 600 is outside the vocabulary of 512",
            ..bad("an id past the vocab", COMPLETIONS, with(&c, json!({"prompt": [1, 2, 600]})), 400, Some("prompt"))
        },
        bad("a negative id", COMPLETIONS, with(&c, json!({"prompt": [1, -2]})), 400, Some("prompt")),
        bad("an id past u32", COMPLETIONS, with(&c, json!({"prompt": [4_294_967_296u64]})), 400, Some("prompt")),
        bad("a prompt number", COMPLETIONS, with(&c, json!({"prompt": 5})), 400, Some("prompt")),
        Bad {
            says: "batched",
            ..bad("two prompts", COMPLETIONS, with(&c, json!({"prompt": ["a", "b"]})), 400, Some("prompt"))
        },
        // Lengths and the context (256 tokens here).
        Bad {
            says: "at least 1",
            ..bad("max_tokens 0", COMPLETIONS, with(&c, json!({"max_tokens": 0})), 400, Some("max_tokens"))
        },
        bad("max_tokens -3", CHAT, with(&m, json!({"max_tokens": -3})), 400, Some("max_tokens")),
        bad(
            "max_completion_tokens 0",
            CHAT,
            with(&m, json!({"max_completion_tokens": 0})),
            400,
            Some("max_completion_tokens"),
        ),
        Bad {
            code: Some("context_length_exceeded"),
            says: "prompt of 3 tokens plus max_tokens 300 exceeds the context of 256 tokens",
            ..bad(
                "prompt plus max_tokens past the context",
                COMPLETIONS,
                with(&c, json!({"prompt": [1, 2, 3], "max_tokens": 300})),
                400,
                Some("max_tokens"),
            )
        },
        Bad {
            code: Some("context_length_exceeded"),
            says: "prompt of 300 tokens plus max_tokens 1 exceeds the context of 256 tokens",
            ..bad(
                "a prompt past the context",
                COMPLETIONS,
                with(&c, json!({"prompt": ids(300), "max_tokens": 1})),
                400,
                Some("max_tokens"),
            )
        },
        Bad {
            code: Some("context_length_exceeded"),
            says: "the prompt has 256 tokens and the context is 256 tokens",
            ..bad(
                "a prompt filling the context, no max_tokens",
                COMPLETIONS,
                with(&c, json!({"prompt": ids(256), "max_tokens": null})),
                400,
                Some("prompt"),
            )
        },
        // Sampling values out of range.
        Bad {
            says: "`temperature` = 3 is out of range [0, 2]",
            ..bad("temperature 3", COMPLETIONS, with(&c, json!({"temperature": 3})), 400, Some("temperature"))
        },
        bad("temperature -0.5", CHAT, with(&m, json!({"temperature": -0.5})), 400, Some("temperature")),
        Bad {
            says: "`top_p` = 0 is out of range (0, 1]",
            ..bad("top_p 0", COMPLETIONS, with(&c, json!({"top_p": 0})), 400, Some("top_p"))
        },
        Bad {
            says: "rounds to 0 as a 32-bit float",
            ..bad("top_p 1e-300", CHAT, with(&m, json!({"top_p": 1e-300})), 400, Some("top_p"))
        },
        Bad {
            says: "needs `logprobs: true`",
            ..bad(
                "top_logprobs without logprobs",
                CHAT,
                with(&m, json!({"top_logprobs": 3})),
                400,
                Some("top_logprobs"),
            )
        },
        bad("top_p 1.5", CHAT, with(&m, json!({"top_p": 1.5})), 400, Some("top_p")),
        Bad {
            says: "`min_p` = 2 is out of range [0, 1]",
            ..bad("min_p 2", COMPLETIONS, with(&c, json!({"min_p": 2})), 400, Some("min_p"))
        },
        Bad { says: "-5", ..bad("top_k -5", COMPLETIONS, with(&c, json!({"top_k": -5})), 400, Some("top_k")) },
        Bad {
            says: "non-negative integer",
            ..bad("seed -1", COMPLETIONS, with(&c, json!({"seed": -1})), 400, Some("seed"))
        },
        bad("seed past u64", CHAT, with(&m, json!({"seed": 18_446_744_073_709_551_616f64})), 400, Some("seed")),
        Bad { says: "out of range [1, 16]", ..bad("n 17", COMPLETIONS, with(&c, json!({"n": 17})), 400, Some("n")) },
        bad("n 0", CHAT, with(&m, json!({"n": 0})), 400, Some("n")),
        Bad {
            says: "must not be empty",
            ..bad("an empty stop string", COMPLETIONS, with(&c, json!({"stop": [""]})), 400, Some("stop"))
        },
        bad("an empty stop string alone", CHAT, with(&m, json!({"stop": ""})), 400, Some("stop")),
        Bad {
            says: "at most 16",
            ..bad(
                "17 stop strings",
                COMPLETIONS,
                with(&c, json!({"stop": (0..17).map(|i| format!("s{i}")).collect::<Vec<_>>()})),
                400,
                Some("stop"),
            )
        },
        bad("logprobs 21", COMPLETIONS, with(&c, json!({"logprobs": 21})), 400, Some("logprobs")),
        bad(
            "top_logprobs 21",
            CHAT,
            with(&m, json!({"logprobs": true, "top_logprobs": 21})),
            400,
            Some("top_logprobs"),
        ),
        Bad {
            says: "out of range [-2, 2]",
            ..bad(
                "presence_penalty 2.5",
                CHAT,
                with(&m, json!({"presence_penalty": 2.5})),
                400,
                Some("presence_penalty"),
            )
        },
        bad("frequency_penalty 3", CHAT, with(&m, json!({"frequency_penalty": 3})), 400, Some("frequency_penalty")),
        Bad {
            says: "must be a number > 0",
            ..bad(
                "repetition_penalty 0",
                COMPLETIONS,
                with(&c, json!({"repetition_penalty": 0})),
                400,
                Some("repetition_penalty"),
            )
        },
        Bad {
            says: "out of range [-100, 100]",
            ..bad("logit_bias 101", CHAT, with(&m, json!({"logit_bias": {"5": 101}})), 400, Some("logit_bias"))
        },
        Bad {
            says: "is not a token id",
            ..bad("logit_bias key x", COMPLETIONS, with(&c, json!({"logit_bias": {"x": 1}})), 400, Some("logit_bias"))
        },
        Bad {
            says: "outside the vocabulary",
            ..bad(
                "logit_bias id 10^9",
                CHAT,
                with(&m, json!({"logit_bias": {"1000000000": 1}})),
                400,
                Some("logit_bias"),
            )
        },
        Bad {
            says: "twice",
            ..bad(
                "logit_bias id twice",
                CHAT,
                with(&m, json!({"logit_bias": {"5": 1, "05": 2}})),
                400,
                Some("logit_bias"),
            )
        },
        // The model.
        Bad {
            kind: "not_found_error",
            code: Some("model_not_found"),
            says: "gpt-4o",
            ..bad("an unknown model", CHAT, with(&m, json!({"model": "gpt-4o"})), 404, Some("model"))
        },
        bad("a model number", COMPLETIONS, with(&c, json!({"model": 4})), 400, Some("model")),
    ];
    // Wrong JSON types, one field at a time, on both routes.
    for (field, wrong) in [
        ("temperature", json!("0.5")),
        ("temperature", json!(true)),
        ("top_p", json!("high")),
        ("top_k", json!(2.5)),
        ("top_k", json!("40")),
        ("min_p", json!([0.1])),
        ("seed", json!("42")),
        ("seed", json!(1.5)),
        ("max_tokens", json!("16")),
        ("max_tokens", json!(1.5)),
        ("n", json!("1")),
        ("stop", json!(5)),
        ("stop", json!([1])),
        ("stream", json!("yes")),
        ("ignore_eos", json!(1)),
        ("draft", json!("no")),
        ("stream_options", json!(true)),
        ("stream_options", json!({"include_usage": "yes"})),
        ("presence_penalty", json!("0")),
        ("frequency_penalty", json!({})),
        ("repetition_penalty", json!("1.1")),
        ("logit_bias", json!([1, 2])),
    ] {
        for (route, base) in [(COMPLETIONS, &c), (CHAT, &m)] {
            let body = with(base, json!({ field: wrong.clone() }));
            t.push(bad("a wrong JSON type", route, body, 400, Some(field)));
        }
    }
    t.push(bad("completions logprobs true", COMPLETIONS, with(&c, json!({"logprobs": true})), 400, Some("logprobs")));
    t.push(bad("chat logprobs 3", CHAT, with(&m, json!({"logprobs": 3})), 400, Some("logprobs")));
    t.push(bad("chat top_logprobs a string", CHAT, with(&m, json!({"top_logprobs": "2"})), 400, Some("top_logprobs")));
    t
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_request_gets_its_4xx_and_an_openai_error_while_a_stream_runs_undisturbed() {
    let s = start(Setup::default()).await;
    // A stream runs through the table (it has started before the first row); it must end exactly as it does
    // alone.
    let long = with(&completion("The long story goes", 200), json!({"stream": true}));
    let mut resp = s.client.post(s.url(COMPLETIONS)).json(&long).send().await.expect("answered");
    assert_eq!(resp.status(), StatusCode::OK);
    let first = resp.chunk().await.expect("a chunk").expect("a first chunk");
    let running = tokio::spawn(async move {
        let mut body = first.to_vec();
        while let Some(c) = resp.chunk().await.expect("a chunk") {
            body.extend_from_slice(&c);
        }
        common::parse_sse(StatusCode::OK, String::new(), &String::from_utf8(body).expect("UTF-8"))
    });
    let rows = table();
    for row in &rows {
        let bytes = match &row.body {
            Value::String(raw) => raw.clone().into_bytes(),
            v => v.to_string().into_bytes(),
        };
        let r = s.post_raw(row.route, bytes, None).await;
        assert_eq!(r.status.as_u16(), row.status, "{} ({}): {}", row.what, row.route, r.text);
        assert_error_object(&r, row.what);
        assert_eq!(r.error_type(), row.kind, "{}: {}", row.what, r.text);
        assert_eq!(r.json["error"]["param"].as_str(), row.param, "{} ({}): {}", row.what, row.route, r.text);
        assert_eq!(r.json["error"]["code"].as_str(), row.code, "{}: {}", row.what, r.text);
        let msg = r.json["error"]["message"].as_str().unwrap_or_default();
        assert!(msg.contains(row.says), "{}: {msg:?} should say {:?}", row.what, row.says);
    }
    assert!(rows.len() > 80, "the table has {} rows", rows.len());
    let streamed = running.await.expect("the stream task");
    assert!(streamed.done);
    let alone = s.post(COMPLETIONS, &with(&long, json!({"stream": false}))).await;
    assert_eq!(alone.status, StatusCode::OK, "{}", alone.text);
    assert_eq!(streamed.token_sha256(), sha_of(&alone.json));
    assert_eq!(streamed.text(), text_of(&alone.json));
    assert_eq!(alone.json["usage"]["completion_tokens"], 200);
}
