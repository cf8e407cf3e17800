//! Tests of the render worker's side without a process (`render_worker::serve` over in-memory pipes) and of the
//! frames (`render_wire`): the same bytes as in-process, a key answered "unknown" until its source comes, a
//! syntax error and a malformed request named, frames past their bounds or cut short refused without allocating.
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
