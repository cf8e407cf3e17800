//! LFM2 chat templates as released (`tests/fixtures/chat_templates`: LiquidAI's LFM2.5-8B-A1B template and
//! llama.cpp's LFM2 template, sources in its README) rendering a tool history through the server's path (the
//! request parsed, `tools` and history calls read as the chat route reads them) equal to what transformers renders
//! (`tools/fixtures/render_chat_templates.py`, jinja2): the tool list, an assistant's calls in each template's own
//! form (Pythonic with Python's `str` of values, or JSON), tool turns, and the generation prompt.

use serde_json::Value;
use std::path::PathBuf;
use tensorfold_server::api;
use tensorfold_server::protocol::ChatCompletionRequest;
use tensorfold_text::Text;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures")
}

/// The fixture tokenizer with `template` as its chat template.
fn text_with(template: &str) -> Text {
    let dir = fixtures().join("lfm2-moe-f32");
    let tokenizer = std::fs::read(dir.join("tokenizer.json")).expect("tokenizer.json");
    let config = std::fs::read(dir.join("tokenizer_config.json")).expect("tokenizer_config.json");
    Text::from_parts(&tokenizer, Some(&config), Some(template)).expect("a text side")
}

/// `s` with the date after "Today's date: " (the render's `strftime_now`) set to the fixtures' date.
fn fixed_date(s: &str) -> String {
    let key = "Today's date: ";
    match s.find(key) {
        Some(i) => format!("{}2026-01-01{}", &s[..i + key.len()], &s[i + key.len() + 10..]),
        None => s.to_string(),
    }
}

/// The conversation rendered with `template` through the chat route's steps.
fn render(template: &str) -> String {
    let body = std::fs::read(fixtures().join("chat_templates/conversation.json")).expect("conversation.json");
    let req: ChatCompletionRequest = api::request(&body).expect("a chat request");
    let params = api::chat_params(&req).expect("valid tools");
    let msgs = api::messages(&req.messages).expect("valid messages");
    let functions: Vec<Value> = params.tools.expect("tools").functions;
    let text = text_with(template);
    let rendered = text.render_chat_with_tools(&msgs, true, Some(&functions)).expect("renders");
    // What the route tokenizes is this text (special-token strings in content kept plain).
    let ids = text.encode_chat_with_tools(&msgs, true, Some(&functions)).expect("encodes");
    assert_eq!(text.decode(&ids, false).expect("decodes"), rendered);
    fixed_date(&rendered)
}

#[test]
fn released_templates_render_a_tool_history_as_transformers_does() {
    for name in ["LFM2.5-8B-A1B", "llama-cpp-lfm2"] {
        let dir = fixtures().join("chat_templates");
        let template = std::fs::read_to_string(dir.join(format!("{name}.jinja"))).expect("the template");
        let expected = std::fs::read_to_string(dir.join(format!("{name}.expected"))).expect("its rendering");
        assert_eq!(render(&template), expected, "{name}");
    }
}
