//! Tests of chat templates given tools: an LFM2-style template writes the function objects with `tojson` spaced
//! as Python's `json.dumps`, history `tool_calls` and `tool_call_id` reach the template, and special-token strings
//! inside tools stay plain text.

use crate::tests::{config, tokenizer_json};
use crate::*;
use serde_json::json;

/// The tools section as LFM2's released templates write it (a system turn listing each tool's `tojson`, joined
/// by ", "), then ChatML turns, a tool turn naming its call id and an assistant's calls by name.
const LFM2_LIKE: &str = "{{- bos_token -}}\
    {%- if tools -%}{{- '<|im_start|>system\\nList of tools: [' -}}\
    {%- for tool in tools -%}{{- tool | tojson -}}{%- if not loop.last -%}{{- ', ' -}}{%- endif -%}{%- endfor -%}\
    {{- ']<|im_end|>\\n' -}}{%- endif -%}\
    {%- for m in messages -%}{{- '<|im_start|>' + m['role'] + '\\n' + m['content'] -}}\
    {%- if m['tool_calls'] is defined -%}{%- for c in m['tool_calls'] -%}\
    {{- c['function']['name'] + '(' + (c['function']['arguments'] | tojson) + ')' -}}{%- endfor -%}{%- endif -%}\
    {%- if m['tool_call_id'] is defined -%}{{- ' #' + m['tool_call_id'] -}}{%- endif -%}\
    {{- '<|im_end|>\\n' -}}{%- endfor -%}";

fn lfm2() -> Text {
    Text::from_parts(tokenizer_json(false).as_bytes(), Some(&config(LFM2_LIKE)), None).unwrap()
}

#[test]
fn tools_are_written_as_python_json_dumps_writes_them() {
    let tools = [json!({"name": "get_weather", "description": "Weather of a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}})];
    let mut call = ChatMessage::new("assistant", "");
    call.tool_calls = Some(vec![json!({"id": "c1", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}}})]);
    let mut answer = ChatMessage::new("tool", "22C");
    answer.tool_call_id = Some("c1".into());
    let msgs = [ChatMessage::new("user", "Weather?"), call, answer];
    let out = lfm2().render_chat_with_tools(&msgs, false, Some(&tools)).unwrap();
    assert_eq!(
        out,
        "<|startoftext|><|im_start|>system\nList of tools: [{\"name\": \"get_weather\", \"description\": \
         \"Weather of a city.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"city\": {\"type\": \
         \"string\"}}, \"required\": [\"city\"]}}]<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n\
         <|im_start|>assistant\nget_weather({\"city\": \"Paris\"})<|im_end|>\n<|im_start|>tool\n22C #c1<|im_end|>\n"
    );
    // Without tools the same messages render with `tools` none, as before.
    let plain = lfm2().render_chat(&msgs[..1], false).unwrap();
    assert_eq!(plain, "<|startoftext|><|im_start|>user\nWeather?<|im_end|>\n");
    // A message's serialized form leaves the absent tool fields out (templates see what they always saw).
    assert_eq!(serde_json::to_value(&msgs[0]).unwrap(), json!({"role": "user", "content": "Weather?"}));
}

#[test]
fn special_token_strings_inside_tools_stay_plain_text() {
    let t = lfm2();
    let im_end = t.token_to_id("<|im_end|>").unwrap();
    let tools = [json!({"name": "f", "description": "x<|im_end|>y"})];
    let msgs = [ChatMessage::new("user", "hi")];
    let ids = t.encode_chat_with_tools(&msgs, false, Some(&tools)).unwrap();
    // The template's own two <|im_end|> (system, user); none from the description.
    assert_eq!(ids.iter().filter(|&&x| x == im_end).count(), 2, "{ids:?}");
    assert_eq!(t.decode(&ids, false).unwrap(), t.render_chat_with_tools(&msgs, false, Some(&tools)).unwrap());
}
