//! Tests of the render worker's side without a process (`render_worker::serve` over in-memory pipes) and of the
//! frames (`render_wire`): the same bytes as in-process, a key answered "unknown" until its source comes, a
//! syntax error and a malformed request named, frames past their bounds or cut short refused without allocating;
//! floats and values nested past serde_json's default depth read back exactly, a long `raise_exception` message
//! cut as in-process, and an answer past the reply bound sent as a named error.
use crate::render_wire::{self, FrameError, RenderRequest, TAG_ERR, TAG_OK, TAG_UNKNOWN, WireError};
use crate::tests::text;
use crate::*;
use std::borrow::Cow;
use std::io::Cursor;

/// The worker's answers (tag and payload) to `requests`, served from one input as a parent would send them.
fn served(requests: &[Vec<u8>]) -> Vec<(u8, Vec<u8>)> {
    let mut out = Vec::new();
    render_worker::serve(&mut Cursor::new(requests.concat()), &mut out).expect("served to the end");
    let mut answers = Vec::new();
    let mut r = Cursor::new(out);
    loop {
        match render_wire::read_frame(&mut r, render_wire::MAX_REPLY_FRAME) {
            Ok(a) => answers.push(a),
            Err(FrameError::Closed) => return answers,
            Err(e) => panic!("{e}"),
        }
    }
}

/// The request frame of rendering `msgs` with `t`'s variables and the template `key` (with `source`).
fn request(t: &Text, key: u64, source: Option<&str>, msgs: &[ChatMessage]) -> Vec<u8> {
    let call = t.render_call(msgs, true, None);
    render_wire::request_frame(&RenderRequest { key, source: source.map(Cow::Borrowed), call }).expect("a frame")
}

#[test]
fn a_worker_renders_the_same_bytes_and_asks_for_a_source_it_does_not_hold() {
    let t = text();
    let source = t.chat_template.clone().expect("a template");
    let msgs = [ChatMessage::new("system", "s"), ChatMessage::new("user", "hi <|im_end|> é")];
    let here = t.render_chat(&msgs, true).expect("renders in process");
    let answers = served(&[
        request(&t, 7, None, &msgs),
        request(&t, 7, Some(&source), &msgs),
        request(&t, 7, None, &msgs),
        request(&t, 8, Some("{% if %}"), &msgs),
    ]);
    assert_eq!(answers[0], (TAG_UNKNOWN, Vec::new()));
    assert_eq!(answers[1], (TAG_OK, here.clone().into_bytes()));
    assert_eq!(answers[2], (TAG_OK, here.into_bytes()));
    assert_eq!(answers[3].0, TAG_ERR);
    let e: WireError = serde_json::from_slice(&answers[3].1).expect("a named error");
    assert!(matches!(TextError::from(e), TextError::Template(m) if m.contains("syntax")));
}

#[test]
fn a_malformed_request_is_named_and_bad_frames_end_the_worker() {
    let bad = render_wire::frame(render_wire::TAG_RENDER, b"{not json").expect("a frame");
    let answers = served(&[bad]);
    let e: WireError = serde_json::from_slice(&answers[0].1).expect("a named error");
    assert!(matches!(TextError::from(e), TextError::Template(m) if m.contains("malformed request")));
    // Past the bound (checked before any allocation), empty, or cut short: the worker ends with an error.
    let huge = ((render_wire::MAX_REQUEST_FRAME + 1) as u32).to_le_bytes().to_vec();
    for input in [huge, vec![0, 0, 0, 0], vec![9, 0, 0, 0, 1, 2], vec![1, 0]] {
        let r = render_worker::serve(&mut Cursor::new(input.clone()), &mut Vec::new());
        assert!(r.is_err(), "{input:?}");
    }
    assert!(matches!(render_wire::read_frame(&mut Cursor::new(vec![0xff; 4]), 16), Err(FrameError::Length(u32::MAX))));
}

/// The request frame of rendering `msgs` with `tools` and the template `source` under `key`.
fn request_with(
    t: &Text,
    key: u64,
    source: &str,
    msgs: &[ChatMessage],
    tools: Option<&[serde_json::Value]>,
) -> Vec<u8> {
    let call = t.render_call(msgs, true, tools);
    render_wire::request_frame(&RenderRequest { key, source: Some(Cow::Borrowed(source)), call }).expect("a frame")
}

/// A float serde_json's default parser reads back one ulp off (its `float_roundtrip` reads it exactly).
const FLOAT: f64 = 0.9856906946328695;

#[test]
fn floats_and_deep_arguments_read_back_exactly_in_the_worker() {
    let mut t = text();
    let source = "{{ tools | tojson }}|{% for m in messages %}{% for c in m.tool_calls or [] %}\
                  {{ c.function.arguments | tojson }}{% endfor %}{% endfor %}";
    t.set_chat_template(source);
    // 126 levels: within the server's own 128 (what its parser takes), past 128 with the frame's 7 around them.
    let mut deep = serde_json::json!([FLOAT]);
    for _ in 0..124 {
        deep = serde_json::json!([deep]);
    }
    let args = serde_json::json!({"x": deep});
    let call = serde_json::json!({"id": "c", "type": "function", "function": {"name": "f", "arguments": args}});
    let msgs = [ChatMessage { tool_calls: Some(vec![call]), ..ChatMessage::new("assistant", "") }];
    let tools = [serde_json::json!({"name": "f", "parameters": {"properties": {"x": {"default": FLOAT}}}})];
    let here = t.render_chat_with_tools(&msgs, true, Some(&tools)).expect("renders in process");
    assert!(here.contains("0.9856906946328695"), "{}", &here[..200]);
    assert_eq!(here.matches("0.9856906946328695").count(), 2);
    let answers = served(&[request_with(&t, 11, source, &msgs, Some(&tools))]);
    assert_eq!(answers[0].0, TAG_OK, "{}", String::from_utf8_lossy(&answers[0].1));
    assert_eq!(String::from_utf8(answers[0].1.clone()).expect("UTF-8"), here);
}

#[test]
fn a_long_raised_message_is_cut_the_same_in_the_worker_and_in_process() {
    let mut t = text();
    // 10 MB of two-byte chars: past the reply frame's bound, cut between chars.
    let source = "{{ raise_exception('é' * 5000000) }}";
    t.set_chat_template(source);
    let msgs = [ChatMessage::new("user", "hi")];
    let here = match t.render_chat(&msgs, true) {
        Err(TextError::Template(m)) => m,
        other => panic!("{other:?}"),
    };
    assert!(here.starts_with("raise_exception: éé"), "{}", &here[..40]);
    assert!(here.ends_with("é... (9983666 more bytes)"), "{}", &here[here.len() - 40..]);
    assert!(here.len() <= 16 << 10, "{}", here.len());
    let answers = served(&[request_with(&t, 12, source, &msgs, None)]);
    assert_eq!(answers[0].0, TAG_ERR);
    let e: WireError = serde_json::from_slice(&answers[0].1).expect("a named error");
    assert!(matches!(TextError::from(e), TextError::Template(m) if m == here));
}

#[test]
fn an_answer_past_the_reply_bound_is_sent_as_a_named_error() {
    let frame = render_worker::reply(TAG_OK, &vec![b'a'; render_wire::MAX_REPLY_FRAME]);
    let (tag, payload) =
        render_wire::read_frame(&mut Cursor::new(frame), render_wire::MAX_REPLY_FRAME).expect("a valid frame");
    assert_eq!(tag, TAG_ERR);
    let e: WireError = serde_json::from_slice(&payload).expect("a named error");
    assert!(matches!(TextError::from(e), TextError::Template(m) if m.contains("could not frame")));
    // Within the bound, the frame as asked.
    let ok = render_worker::reply(TAG_OK, b"prompt");
    assert_eq!(render_wire::read_frame(&mut Cursor::new(ok), 64).expect("a frame"), (TAG_OK, b"prompt".to_vec()));
}
