//! `n` choices over HTTP: choice `i` equals the same request with `n: 1` and seed `seed + i` (vLLM's derivation),
//! whole and streamed (chunks carry their choice's `index`), on both routes; the usage counts the prompt once and
//! every choice's tokens; `best_of` above `n` returns the `n` candidates of the highest cumulative logprob, best
//! first; bad `n` / `best_of` values are named 400s.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::{Value, json};

/// Choice `i`'s text in a stream: its chunks' pieces joined.
fn streamed_text(s: &Streamed, i: usize) -> String {
    s.chunks
        .iter()
        .filter_map(|c| c["choices"].get(0).filter(|ch| ch["index"] == i))
        .map(|ch| ch["text"].as_str().or_else(|| ch["delta"]["content"].as_str()).unwrap_or("").to_string())
        .collect()
}

fn choice_text(v: &Value, i: usize) -> String {
    let c = &v["choices"][i];
    c["text"].as_str().or_else(|| c["message"]["content"].as_str()).expect("a text").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_choice_equals_its_seeded_request_alone_whole_and_streamed() {
    let s = start(Setup::default()).await;
    for (route, base) in [(COMPLETIONS, completion("Once upon a time", 16)), (CHAT, chat("Tell me a story.", 16))] {
        let body = with(&base, json!({"temperature": 0.9, "seed": 40, "n": 3}));
        let r = s.post(route, &body).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        let choices = r.json["choices"].as_array().expect("choices");
        assert_eq!(choices.len(), 3);
        let mut shas = Vec::new();
        for (i, choice) in choices.iter().enumerate() {
            assert_eq!(choice["index"], i);
            let alone = s.post(route, &with(&body, json!({"n": 1, "seed": 40 + i}))).await;
            assert_eq!(alone.status, StatusCode::OK);
            assert_eq!(r.json["tensorfold"]["choices"][i]["token_sha256"], alone.json["tensorfold"]["token_sha256"]);
            assert_eq!(r.json["tensorfold"]["choices"][i]["seed"], 40 + i);
            assert_eq!(choice_text(&r.json, i), text_of(&alone.json), "{route} choice {i}");
            shas.push(sha_of(&alone.json));
        }
        assert!(shas[0] != shas[1] || shas[1] != shas[2], "{route}: the seeds give different choices");
        assert_eq!(r.json["usage"]["completion_tokens"], 48);
        assert_eq!(r.json["usage"]["total_tokens"], r.json["usage"]["prompt_tokens"].as_u64().unwrap() + 48);
        let st =
            s.stream(route, &with(&body, json!({"stream": true, "stream_options": {"include_usage": true}}))).await;
        assert!(st.done);
        for i in 0..3 {
            assert_eq!(streamed_text(&st, i), choice_text(&r.json, i), "{route} streamed choice {i}");
            let fin: Vec<&Value> = st
                .chunks
                .iter()
                .filter(|c| c["choices"].get(0).is_some_and(|ch| ch["index"] == i && !ch["finish_reason"].is_null()))
                .collect();
            assert_eq!(fin.len(), 1, "one finish chunk for choice {i}");
            assert_eq!(fin[0]["tensorfold"]["token_sha256"], r.json["tensorfold"]["choices"][i]["token_sha256"]);
        }
        let usage = st.chunks.last().expect("a usage chunk");
        assert_eq!(usage["usage"]["completion_tokens"], 48, "{usage}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_n_and_best_of_are_named_400s() {
    let s = start(Setup::default()).await;
    let c = completion("Hello", 4);
    for (patch, param, says) in [
        (json!({"n": 0}), "n", "out of range"),
        (json!({"n": 17}), "n", "out of range"),
        (json!({"n": 9}), "n", "lanes"),
        (json!({"n": 2, "best_of": 17}), "best_of", "out of range"),
        (json!({"n": 2, "best_of": 1}), "best_of", "at least"),
        (json!({"n": 1, "best_of": 2, "stream": true}), "best_of", "cannot be streamed"),
    ] {
        let r = s.post(COMPLETIONS, &with(&c, patch.clone())).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{patch}: {}", r.text);
        assert_eq!(r.json["error"]["param"], param, "{patch}");
        assert!(r.json["error"]["message"].as_str().unwrap_or("").contains(says), "{patch}: {}", r.text);
        assert_error_object(&r, "bad n");
    }
    let ok = s.post(COMPLETIONS, &with(&c, json!({"n": 2, "best_of": 2}))).await;
    assert_eq!(ok.status, StatusCode::OK, "{}", ok.text);
    // Greedy: both choices are the greedy reply.
    assert_eq!(
        ok.json["tensorfold"]["choices"][0]["token_sha256"],
        ok.json["tensorfold"]["choices"][1]["token_sha256"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn best_of_returns_the_candidates_of_the_highest_cumulative_logprob_best_first() {
    let s = start(Setup::default()).await;
    let body = with(&completion("Once upon a time", 8), json!({"temperature": 1.0, "seed": 70, "n": 2, "best_of": 5}));
    let r = s.post(COMPLETIONS, &body).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    // Each candidate alone (seed 70 + k, its logprobs asked for): its cumulative logprob and its tokens.
    let mut alone = Vec::new();
    for k in 0..5u64 {
        let a = s.post(COMPLETIONS, &with(&body, json!({"n": 1, "best_of": 1, "seed": 70 + k, "logprobs": 0}))).await;
        let lps = a.json["choices"][0]["logprobs"]["token_logprobs"].as_array().expect("logprobs").clone();
        let sum: f64 = lps.iter().map(|x| x.as_f64().expect("a number")).sum();
        alone.push((sum, 70 + k, sha_of(&a.json), a.json["usage"]["completion_tokens"].as_u64().unwrap()));
    }
    let mut ranked = alone.clone();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    assert!(ranked[1].0 > ranked[2].0, "no tie at the cut: {ranked:?}");
    let choices = r.json["choices"].as_array().expect("choices");
    assert_eq!(choices.len(), 2);
    for (i, want) in ranked.iter().take(2).enumerate() {
        assert_eq!(choices[i]["index"], i);
        assert!(choices[i]["logprobs"].is_null(), "logprobs were not asked for: {}", r.text);
        let stats = &r.json["tensorfold"]["choices"][i];
        assert_eq!((stats["seed"].as_u64(), stats["token_sha256"].as_str()), (Some(want.1), Some(want.2.as_str())));
    }
    assert_eq!(r.json["usage"]["completion_tokens"].as_u64(), Some(ranked[0].3 + ranked[1].3));
    assert!(ranked[0].1 != 70 || ranked[1].1 != 71, "the ranking changed the order: {ranked:?}");
}
