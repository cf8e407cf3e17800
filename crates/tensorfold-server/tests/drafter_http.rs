//! The block drafter over HTTP: a drafted reply equals its `"draft": false` reply (greedy and sampled,
//! concurrent requests), and the `tensorfold` object and `/metrics` report what was drafted and accepted.

mod common;

use common::*;
use serde_json::json;
use tensorfold_engine::EngineConfig;

fn setup() -> Setup {
    let d = Setup::default();
    Setup { drafter: true, engine: EngineConfig { copy_min: 0, ..d.engine }, ..d }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_drafted_replies_equal_plain_replies_and_report_acceptance() {
    let s = start(setup()).await;
    let bodies: Vec<serde_json::Value> = (0..4)
        .map(|i| {
            with(
                &completion(&format!("Once upon a time {i}"), 24),
                json!({"temperature": 0.5 * (i % 2) as f64, "seed": i}),
            )
        })
        .collect();
    let drafted = futures_join(&s, &bodies).await;
    let plain: Vec<serde_json::Value> = bodies.iter().map(|b| with(b, json!({"draft": false}))).collect();
    let undrafted = futures_join(&s, &plain).await;
    for (d, p) in drafted.iter().zip(&undrafted) {
        assert_eq!(sha_of(d), sha_of(p));
        assert_eq!(text_of(d), text_of(p));
        let t = &d["tensorfold"];
        let windows = t["verify_windows"].as_u64().expect("verify_windows");
        assert!(windows > 0 && t["drafted"].as_u64() > Some(0), "{t}");
        let by_pos = t["accepted_by_position"].as_array().expect("accepted_by_position");
        let accepted: u64 = by_pos.iter().map(|n| n.as_u64().expect("a count")).sum();
        assert_eq!(json!(accepted), t["accepted"], "acceptance by position sums to the accepted drafts");
        let mean = t["mean_accepted_length"].as_f64().expect("mean_accepted_length");
        assert!((mean - (accepted + windows) as f64 / windows as f64).abs() < 1e-9, "{t}");
        assert_eq!(p["tensorfold"]["verify_windows"], json!(0));
    }
    let m = s.metrics().await;
    assert!(sample(&m, "tensorfold_draft_windows_total").is_some_and(|w| w > 0.0), "{m}");
    assert!(sample(&m, "tensorfold_mean_accepted_length").is_some_and(|w| w >= 1.0), "{m}");
    assert!(m.contains("tensorfold_accepted_by_position_total{position=\"0\"}"), "{m}");
}

/// Posts every body at once and returns the replies in order.
async fn futures_join(s: &Server, bodies: &[serde_json::Value]) -> Vec<serde_json::Value> {
    let mut handles = Vec::new();
    for b in bodies {
        let (client, url, b) = (s.client.clone(), s.url(COMPLETIONS), b.clone());
        handles.push(tokio::spawn(async move {
            client.post(url).json(&b).send().await.expect("sent").json::<serde_json::Value>().await.expect("json")
        }));
    }
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.expect("joined"));
    }
    out
}
