//! Connection and request bounds over real loopback sockets: slow headers are cut at the header timeout, a body
//! that never arrives is a 408, idle kept-alive connections close, one connection past the cap is a quick 503
//! (and `/health` answers again once connections close), hundreds of slow connections do not stop normal
//! requests, non-JSON bodies are 415, and tokenizing runs off the async workers behind its byte bound.

mod common;

use common::{COMPLETIONS, Setup, start};
use reqwest::StatusCode;
use serde_json::{Value, json};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;
use tensorfold_server::limits::TextPool;
use tensorfold_server::listen::ConnLimits;

fn limits(f: impl FnOnce(&mut ConnLimits)) -> Setup {
    let mut conn = ConnLimits::default();
    f(&mut conn);
    Setup { conn, ..Setup::default() }
}

fn connect(base: &str) -> TcpStream {
    let s = TcpStream::connect(base.trim_start_matches("http://")).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).expect("a read timeout");
    s
}

/// Everything the server sends until it closes (or 10 s pass).
fn read_all(mut s: TcpStream) -> String {
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_header_sent_a_byte_at_a_time_is_cut_at_the_header_timeout() {
    let s = start(limits(|c| c.header_timeout = Duration::from_millis(400))).await;
    let base = s.base.clone();
    let sent = tokio::task::spawn_blocking(move || {
        let mut sock = connect(&base);
        sock.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        // Up to 100 bytes, one every 100 ms (10 s): the server must close the connection long before.
        let head = b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        for (i, b) in head.iter().enumerate() {
            if sock.write_all(&[*b]).is_err() {
                return i;
            }
            let mut buf = [0u8; 256];
            match sock.read(&mut buf) {
                Ok(0) => return i,
                Ok(_) => return i,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock || e.kind() == std::io::ErrorKind::TimedOut => {}
                Err(_) => return i,
            }
        }
        head.len()
    })
    .await
    .unwrap();
    assert!(sent < 100, "the slow header was still being read after {sent} bytes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_body_that_never_arrives_is_a_408() {
    let s = start(limits(|c| c.body_timeout = Duration::from_millis(300))).await;
    let base = s.base.clone();
    let answer = tokio::task::spawn_blocking(move || {
        let mut sock = connect(&base);
        let head = "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{";
        sock.write_all(head.as_bytes()).unwrap();
        read_all(sock)
    })
    .await
    .unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body timeout"), "{answer}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kept_alive_connection_is_closed_after_the_idle_timeout() {
    let s = start(limits(|c| c.idle_timeout = Duration::from_millis(300))).await;
    let base = s.base.clone();
    let answer = tokio::task::spawn_blocking(move || {
        let mut sock = connect(&base);
        sock.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        // The reply, then EOF once the connection has idled: read_to_end returns instead of timing out.
        let mut out = Vec::new();
        let r = sock.read_to_end(&mut out);
        (r.is_ok(), String::from_utf8_lossy(&out).into_owned())
    })
    .await
    .unwrap();
    assert!(answer.0, "the idle connection was not closed by the server: {}", answer.1);
    assert!(answer.1.starts_with("HTTP/1.1 200"), "{}", answer.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_connection_past_the_cap_is_a_quick_503_and_health_answers_once_they_close() {
    let s = start(limits(|c| c.max_connections = 4)).await;
    let base = s.base.clone();
    let (over, held) = tokio::task::spawn_blocking(move || {
        let held: Vec<TcpStream> = (0..4).map(|_| connect(&base)).collect();
        std::thread::sleep(Duration::from_millis(200));
        let mut fifth = connect(&base);
        let _ = fifth.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n");
        (read_all(fifth), held)
    })
    .await
    .unwrap();
    assert!(over.starts_with("HTTP/1.1 503"), "{over}");
    let body: Value = serde_json::from_str(over.split("\r\n\r\n").nth(1).unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "too_many_connections");
    drop(held);
    // The permits come back as the server sees the four close; /health answers again.
    let mut ok = false;
    for _ in 0..100 {
        // Until the permits are back a connection may get the 503 and a close before its request is read.
        if s.client.get(s.url("/health")).send().await.is_ok_and(|r| r.status() == StatusCode::OK) {
            ok = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ok, "/health never answered once the connections closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_slow_connections_do_not_stop_normal_requests() {
    let s = start(Setup::default()).await;
    let base = s.base.clone();
    let slow = tokio::task::spawn_blocking(move || {
        (0..300)
            .map(|i| {
                let mut c = connect(&base);
                // A third send half a header, a third half a body, a third nothing (idle).
                let _ = match i % 3 {
                    0 => c.write_all(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n"),
                    1 => c.write_all(b"POST /tokenize HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 50\r\n\r\n{"),
                    _ => Ok(()),
                };
                c
            })
            .collect::<Vec<_>>()
    })
    .await
    .unwrap();
    assert_eq!(s.get("/health").await.status, StatusCode::OK);
    let r = s.post(COMPLETIONS, &json!({"prompt": "Hello", "max_tokens": 4})).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.json["usage"]["completion_tokens"], 4);
    drop(slow);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_that_are_not_json_are_415_on_every_post_route() {
    let s = start(Setup::default()).await;
    let body = json!({"prompt": "Hello", "max_tokens": 2}).to_string();
    for route in [COMPLETIONS, "/v1/chat/completions", "/tokenize", "/detokenize"] {
        for ct in [
            Some("text/plain"),
            Some("multipart/form-data; boundary=x"),
            Some("application/x-www-form-urlencoded"),
            None,
        ] {
            let mut req = s.client.post(s.url(route)).body(body.clone());
            if let Some(ct) = ct {
                req = req.header("content-type", ct);
            }
            let r = req.send().await.unwrap();
            assert_eq!(r.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "{route} {ct:?}");
            let v: Value = r.json().await.unwrap();
            assert!(v["error"]["message"].as_str().unwrap().contains("application/json"), "{v}");
        }
    }
    // JSON with a charset, and the +json suffix, are JSON.
    for ct in ["application/json; charset=utf-8", "Application/JSON", "application/vnd.api+json"] {
        let r = s.client.post(s.url(COMPLETIONS)).header("content-type", ct).body(body.clone()).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{ct}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_answers_while_large_tokenizations_run() {
    let s = std::sync::Arc::new(start(Setup::default()).await);
    // Four bodies of ~3 MiB of text each (just under the 8 MiB in flight for two at once; others wait or 429).
    let text: String = "def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n".repeat(40_000);
    let order = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut jobs = Vec::new();
    for i in 0..2 {
        let (s, text, order) = (s.clone(), text.clone(), order.clone());
        jobs.push(tokio::spawn(async move {
            let r = s.post("/tokenize", &json!({"prompt": text})).await;
            order.lock().unwrap().push(format!("tokenize {i}: {}", r.status));
            r
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let h = s.get("/health").await;
    order.lock().unwrap().push("health".to_string());
    assert_eq!(h.status, StatusCode::OK);
    for j in jobs {
        let r = j.await.unwrap();
        assert_eq!(r.status, StatusCode::OK, "{}", r.text);
        assert!(r.json["count"].as_u64().unwrap() > 100_000);
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order[0], "health", "health waited for the tokenizations: {order:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_past_the_bytes_in_flight_is_a_429_at_once() {
    let pool = TextPool::new(2, 1000);
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let p = pool.clone();
    let busy = tokio::spawn(async move { p.run(800, move || rx.recv().is_ok()).await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let refused = pool.run(300, || true).await.expect_err("800 + 300 bytes are past 1000");
    assert_eq!(refused.status.as_u16(), 429);
    assert!(refused.message.contains("tokenizer is busy"), "{}", refused.message);
    assert!(pool.run(200, || true).await.expect("800 + 200 fit"));
    tx.send(()).unwrap();
    assert!(busy.await.unwrap().expect("the held job finishes"));
    assert!(pool.run(5000, || true).await.expect("one text alone past the bound is weighed as the whole bound"));
}
