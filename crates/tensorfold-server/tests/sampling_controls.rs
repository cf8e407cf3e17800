//! Logit controls over HTTP: `presence_penalty`, `frequency_penalty`, `repetition_penalty` and `logit_bias` change
//! the reply, give the same tokens plain and streamed, drafted and `draft: false`, and a `logit_bias` of 100 forces
//! its token.

mod common;

use common::*;
use reqwest::StatusCode;
use serde_json::json;
use tensorfold_engine::keyed::token_sha256;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn penalties_change_the_reply_and_drafting_changes_no_token_of_it() {
    let s = start(Setup::default()).await;
    // The fixture's greedy text falls into a loop (which context copies draft): the penalties break it.
    let body = completion("Once upon a time", 48);
    let unpenalized = s.post(COMPLETIONS, &body).await;
    assert_eq!(unpenalized.status, StatusCode::OK, "{}", unpenalized.text);
    for controls in [
        json!({"repetition_penalty": 1.5}),
        json!({"presence_penalty": 1.5, "frequency_penalty": 0.5}),
        json!({"frequency_penalty": 2, "temperature": 0.8, "seed": 3}),
    ] {
        let penalized = with(&body, controls.clone());
        let drafted = s.post(COMPLETIONS, &penalized).await;
        assert_eq!(drafted.status, StatusCode::OK, "{}", drafted.text);
        let serial = s.post(COMPLETIONS, &with(&penalized, json!({"draft": false}))).await;
        assert_eq!(sha_of(&drafted.json), sha_of(&serial.json), "{controls}: drafted vs draft:false");
        assert_eq!(serial.json["tensorfold"]["drafted"], 0);
        let streamed = s.stream(COMPLETIONS, &with(&penalized, json!({"stream": true}))).await;
        assert_eq!(streamed.token_sha256(), sha_of(&drafted.json), "{controls}: streamed vs plain");
        assert_ne!(sha_of(&drafted.json), sha_of(&unpenalized.json), "{controls} changes the reply");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_logit_bias_of_100_forces_its_token_and_minus_100_bans_it() {
    let s = start(Setup::default()).await;
    let forced = with(&chat("Hello", 6), json!({"logit_bias": {"42": 100}, "temperature": 1, "seed": 1}));
    let r = s.post(CHAT, &forced).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(sha_of(&r.json), token_sha256(&[42; 6]));
    let body = completion("Once upon a time", 12);
    let greedy = s.post(COMPLETIONS, &with(&body, json!({"logprobs": 0}))).await;
    let first = greedy.json["choices"][0]["logprobs"]["tokens"][0].clone();
    let tokenized =
        s.post("/tokenize", &json!({"prompt": first.as_str().expect("a token"), "add_special_tokens": false})).await;
    let id = tokenized.json["tokens"][0].as_u64().expect("an id");
    assert_eq!(tokenized.json["tokens"].as_array().map(Vec::len), Some(1), "{}", tokenized.text);
    let banned = s.post(COMPLETIONS, &with(&body, json!({"logprobs": 0, "logit_bias": {id.to_string(): -100}}))).await;
    assert_eq!(banned.status, StatusCode::OK, "{}", banned.text);
    assert_ne!(banned.json["choices"][0]["logprobs"]["tokens"][0], first, "token {id} ({first}) is banned");
}
