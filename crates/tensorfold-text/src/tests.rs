//! Tests of the text side: round trips, the UTF-8 safe detokenizer, chat templates, refusals.
use crate::chat_template::strftime_utc;
use crate::*;
use serde_json::json;
use std::fs;
use std::sync::Arc;

const SPECIALS: &str =
    "<|pad|> <|startoftext|> <|endoftext|> <|fim_pre|> <|fim_mid|> <|fim_suf|> <|im_start|> <|im_end|>";

/// GPT-2's byte -> char table of byte-level BPE: printable bytes map to themselves, the
/// others in ascending order to U+0100, U+0101, ...
fn byte_chars() -> Vec<char> {
    let printable = |b: &u32| (33..=126).contains(b) || (161..=172).contains(b) || (174..=255).contains(b);
    let mut next = 255;
    let code = |b: u32| {
        if printable(&b) {
            b
        } else {
            next += 1;
            next
        }
    };
    (0..256).map(code).map(|c| char::from_u32(c).unwrap()).collect()
}

/// A tiny byte-level BPE tokenizer.json: specials 0..=7 (LFM2's layout), bytes 8..=263,
/// then merges that split multibyte characters across tokens ("世" = [E4 B8][96],
/// "🙂" = [F0 9F][99 82], " →" = [20 E2][86][92], "é" = [C3][A9]).
#[rustfmt::skip]
pub(crate) fn tokenizer_json(bos_post_processor: bool) -> String {
    let table = byte_chars();
    let sym = |bytes: &[u8]| bytes.iter().map(|&b| table[b as usize]).collect::<String>();
    let mut vocab = serde_json::Map::new();
    for (i, s) in SPECIALS.split(' ').enumerate() {
        vocab.insert((*s).into(), json!(i));
    }
    for b in 0..=255u8 {
        vocab.insert(sym(&[b]), json!(8 + u32::from(b)));
    }
    let merges: [(&[u8], &[u8]); 7] = [(b"h", b"e"), (b"l", b"l"), (b"he", b"ll"), (&[0xE4], &[0xB8]),
        (&[0xF0], &[0x9F]), (&[0x99], &[0x82]), (b" ", &[0xE2])];
    let mut merge_list = vec![];
    for (a, b) in merges {
        let joined = [a, b].concat();
        let next = vocab.len();
        vocab.insert(sym(&joined), json!(next));
        merge_list.push(json!([sym(a), sym(b)]));
    }
    let byte_level =
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true});
    let added: Vec<_> = SPECIALS.split(' ').enumerate().map(|(i, s)| json!({"id": i, "content": s,
        "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true}))
        .collect();
    let post = bos_post_processor.then(|| json!({
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|startoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": "<|startoftext|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|startoftext|>": {"id": "<|startoftext|>", "ids": [1], "tokens": ["<|startoftext|>"]}}
    }));
    json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": byte_level, "post_processor": post,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": null, "unk_token": null,
            "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false,
            "byte_fallback": false, "ignore_merges": false, "vocab": vocab, "merges": merge_list}
    })
    .to_string()
}

/// ChatML with a BOS; newlines follow block tags only (trim_blocks eats them), and it
/// uses `continue` (loop_controls) and `.strip()` (pycompat).
pub(crate) const CHATML: &str = "{{ bos_token }}{% for message in messages %}\n\
    \x20 {% if message['role'] == 'ignored' %}{% continue %}{% endif %}\n\
    {{ '<|im_start|>' + message['role'] + '\\n' }}{% if message['content'] is string %}\n\
    {{ message['content'].strip() }}{% else %}\n\
    {% for part in message['content'] %}{{ part['text'] }}{% endfor %}{% endif %}\n\
    {{ '<|im_end|>\\n' }}{% endfor %}\n\
    {% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

pub(crate) fn config(template: &str) -> Vec<u8> {
    json!({"chat_template": template, "bos_token": {"content": "<|startoftext|>", "lstrip": false},
        "eos_token": "<|im_end|>", "pad_token": null})
    .to_string()
    .into_bytes()
}

pub(crate) fn text() -> Text {
    Text::from_parts(tokenizer_json(false).as_bytes(), Some(&config(CHATML)), None).unwrap()
}

const UNICODE: &str = "héllo → 世界 🙂";

#[test]
fn encode_decode_round_trip() {
    let t = text();
    assert_eq!(t.vocab_size(), 8 + 256 + 7);
    assert_eq!(t.token_to_id("<|im_end|>"), Some(7));
    assert_eq!(t.bos_token(), Some("<|startoftext|>"));
    assert_eq!(t.eos_token(), Some("<|im_end|>"));
    assert_eq!(t.pad_token(), None);
    let hello = t.encode("hello", false).unwrap();
    assert_eq!(hello, vec![8 + 256 + 2, 8 + u32::from(b'o')]);
    for s in ["Hello, world! 123", UNICODE, ""] {
        let ids = t.encode(s, true).unwrap();
        assert_eq!(t.decode(&ids, false).unwrap(), s);
    }
    let ids = t.encode("<|im_start|>hi<|im_end|>", false).unwrap();
    assert_eq!(ids.first(), Some(&6));
    assert_eq!(ids.last(), Some(&7));
    assert_eq!(t.decode(&ids, true).unwrap(), "hi");
}

#[test]
fn detokenizer_never_splits_characters() {
    let t = text();
    let ids = t.encode(UNICODE, false).unwrap();
    // The test must exercise splits: "世" starts with a two-byte token.
    let shi = t.token_to_id("ä¸").unwrap();
    assert!(ids.contains(&shi));
    assert!(t.decode(&[shi], false).unwrap().contains('\u{FFFD}'));
    let mut detok = t.detokenizer(false);
    let mut out = String::new();
    for &id in &ids {
        let piece = detok.push(id).unwrap();
        assert!(!piece.contains('\u{FFFD}'), "piece {piece:?}");
        out += &piece;
    }
    out += &detok.finish();
    assert_eq!(out, t.decode(&ids, false).unwrap());
    assert_eq!(out, UNICODE);
}

#[test]
fn detokenizer_finish_and_special_tokens() {
    let t = Arc::new(text());
    // Stream ending mid-character: held back, then flushed as decode renders it.
    let shi = t.token_to_id("ä¸").unwrap();
    let ids = [8 + u32::from(b'a'), shi];
    let mut detok = Detokenizer::new(Arc::clone(&t), false);
    assert_eq!(detok.push(ids[0]).unwrap(), "a");
    assert_eq!(detok.push(ids[1]).unwrap(), "");
    assert_eq!(detok.finish(), "\u{FFFD}");
    assert_eq!(t.decode(&ids, false).unwrap(), "a\u{FFFD}");
    for skip in [true, false] {
        let ids = t.encode("<|im_start|>hé<|im_end|>", false).unwrap();
        let mut detok = t.detokenizer(skip);
        let out: String = ids.iter().map(|&id| detok.push(id).unwrap()).collect();
        let all = out + &detok.finish();
        assert_eq!(all, t.decode(&ids, skip).unwrap());
        assert_eq!(all, if skip { "hé" } else { "<|im_start|>hé<|im_end|>" });
    }
    let mut detok = t.detokenizer(false);
    assert!(matches!(detok.push(100_000), Err(TextError::UnknownToken(100_000))));
    assert_eq!(detok.push(8 + u32::from(b'x')).unwrap(), "x");
}

#[test]
fn chat_template_renders_chatml() {
    let t = text();
    let messages: Vec<ChatMessage> = serde_json::from_value(json!([
        {"role": "system", "content": "  Be brief. "},
        {"role": "ignored", "content": "skip me"},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]},
    ]))
    .unwrap();
    assert_eq!(messages[2].content.as_text(), "hi there");
    let expected = "<|startoftext|><|im_start|>system\nBe brief.<|im_end|>\n\
        <|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n";
    assert_eq!(t.render_chat(&messages, true).unwrap(), expected);
    let no_prompt = t.render_chat(&messages, false).unwrap();
    assert_eq!(no_prompt, expected.trim_end_matches("<|im_start|>assistant\n"));
    // Serialized back to the OpenAI shape.
    assert_eq!(
        serde_json::to_value(&messages[2]).unwrap(),
        json!({"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]})
    );
    assert!(serde_json::from_value::<ChatMessage>(json!({"role": "user", "content": 5})).is_err());
}

#[test]
fn encode_chat_adds_no_second_bos() {
    let tok = tokenizer_json(true);
    let t = Text::from_parts(tok.as_bytes(), Some(&config(CHATML)), None).unwrap();
    let messages = [ChatMessage::new("user", "hi")];
    let ids = t.encode_chat(&messages, true).unwrap();
    assert_eq!(ids.iter().filter(|&&id| id == 1).count(), 1);
    assert_eq!(ids[..2], [1, 6]);
    assert_eq!(t.encode_prompt("hi").unwrap()[0], 1);
    assert!(matches!(t.encode_prompt(""), Err(TextError::EmptyPrompt)));
}

#[test]
fn template_sources_and_errors() {
    let tok = tokenizer_json(false);
    let jinja = "J:{{ messages[0]['content'] }}|{{ tools is none }}|{{ strftime_now('%Y') | length }}";
    let t = Text::from_parts(tok.as_bytes(), Some(&config(CHATML)), Some(jinja)).unwrap();
    assert_eq!(t.render_chat(&[ChatMessage::new("user", "x")], false).unwrap(), "J:x|True|4");
    let listed =
        json!({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]});
    let t = Text::from_parts(tok.as_bytes(), Some(listed.to_string().as_bytes()), None).unwrap();
    assert_eq!(t.render_chat(&[], false).unwrap(), "D");

    let bare = Text::from_parts(tok.as_bytes(), None, None).unwrap();
    assert!(!bare.has_chat_template() && bare.bos_token().is_none());
    assert!(matches!(bare.render_chat(&[], true), Err(TextError::NoChatTemplate)));
    assert!(matches!(bare.encode_chat(&[], true), Err(TextError::NoChatTemplate)));

    let raising =
        Text::from_parts(tok.as_bytes(), None, Some("{{ raise_exception('roles must alternate') }}")).unwrap();
    match raising.render_chat(&[], true) {
        Err(TextError::Template(msg)) => assert!(msg.contains("roles must alternate"), "{msg}"),
        other => panic!("expected Template error, got {other:?}"),
    }
    let broken = Text::from_parts(tok.as_bytes(), None, Some("{% for %}")).unwrap();
    assert!(matches!(broken.render_chat(&[], true), Err(TextError::Template(_))));
}

#[test]
fn bad_inputs_are_named_errors() {
    let t = text();
    assert!(matches!(t.encode_prompt(""), Err(TextError::EmptyPrompt)));
    assert_eq!(t.encode_prompt("a").unwrap(), vec![8 + u32::from(b'a')]);
    assert!(matches!(t.decode(&[9, 271], false), Err(TextError::UnknownToken(271))));
    match Text::from_parts(b"{\"model\": 1", None, None) {
        Err(TextError::Tokenizer(msg)) => assert!(msg.starts_with("tokenizer.json: "), "{msg}"),
        other => panic!("expected Tokenizer error, got {other:?}"),
    }
    let tok = tokenizer_json(false);
    for cfg in [&b"[1, 2"[..], b"[]", br#"{"bos_token": 3}"#, br#"{"chat_template": [{"name": "x", "template": "y"}]}"#]
    {
        assert!(matches!(Text::from_parts(tok.as_bytes(), Some(cfg), None), Err(TextError::Config { .. })));
    }
}

#[test]
fn open_reads_a_checkpoint_directory() {
    let dir = tempfile::tempdir().unwrap();
    assert!(Text::open(dir.path()).unwrap().is_none());
    fs::write(dir.path().join("tokenizer.json"), tokenizer_json(false)).unwrap();
    fs::write(dir.path().join("tokenizer_config.json"), config("C")).unwrap();
    let t = Text::open(dir.path()).unwrap().unwrap();
    assert_eq!(t.render_chat(&[], false).unwrap(), "C");
    fs::write(dir.path().join("chat_template.jinja"), "JINJA").unwrap();
    let t = Text::open(dir.path()).unwrap().unwrap();
    assert_eq!(t.render_chat(&[], false).unwrap(), "JINJA");
    fs::write(dir.path().join("chat_template.jinja"), [0xFFu8, 0xFE]).unwrap();
    match Text::open(dir.path()) {
        Err(TextError::Config { path, .. }) => assert!(path.ends_with("chat_template.jinja")),
        other => panic!("expected Config error, got {other:?}"),
    }
    fs::remove_file(dir.path().join("chat_template.jinja")).unwrap();
    fs::write(dir.path().join("tokenizer.json"), "not json").unwrap();
    match Text::open(dir.path()) {
        Err(e @ TextError::Tokenizer(_)) => assert!(e.to_string().contains("tokenizer.json")),
        other => panic!("expected Tokenizer error, got {other:?}"),
    }
}

#[test]
fn strftime_formats_utc() {
    // 1_700_000_000 s = Tuesday 2023-11-14 22:13:20 UTC, day 318 of the year.
    assert_eq!(
        strftime_utc("%Y-%m-%d %H:%M:%S %a %b %e %j %I%p %% %Q", 1_700_000_000),
        "2023-11-14 22:13:20 Tue Nov 14 318 10PM % %Q"
    );
    assert_eq!(strftime_utc("%d %B %Y %A %j", 951_782_400), "29 February 2000 Tuesday 060");
    assert_eq!(strftime_utc("%Y-%m-%d %j", 0), "1970-01-01 001");
}

#[test]
fn text_is_shareable_across_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Text>();
    assert_send_sync::<Detokenizer<Arc<Text>>>();
}
