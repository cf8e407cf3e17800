//! Validating OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` into a [`ToolPlan`], each refusal a 400
//! naming the field (the checks and answers OpenAI's API gives: function names `^[a-zA-Z0-9_-]{1,64}$`, parameters a
//! JSON object schema, `required` or a named function only with tools).

use crate::error::ApiError;
use crate::protocol::Field;
use serde::Deserialize;
use serde_json::Value;
use tensorfold_engine::tool_grammar::ToolSpec;

/// Most tools a request may offer (OpenAI's limit).
pub const MAX_TOOLS: usize = 128;

/// Longest `description` of a tool, in bytes.
pub const MAX_DESCRIPTION: usize = 64 << 10;

/// `tool_choice`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ToolChoice {
    /// The model may call tools (the default with tools): calls are parsed from the reply.
    Auto,
    /// Tools are shown to the template but nothing is parsed or constrained (vLLM's meaning).
    None,
    /// The reply is constrained to a call of any offered tool.
    Required,
    /// The reply is constrained to a call of this tool.
    Named(String),
}

/// The validated tool fields of a chat request.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolPlan {
    /// The function objects as sent (`{"name", "description", "parameters"}`), the list the template's `tools`
    /// is bound to (the form LFM2 templates write).
    pub functions: Vec<Value>,
    /// Each tool's name and parameters' schema, for the grammar.
    pub specs: Vec<ToolSpec>,
    /// `tool_choice`.
    pub choice: ToolChoice,
    /// `parallel_tool_calls` (default true).
    pub parallel: bool,
    /// The tokenizer's ids of the call markers, when they are special tokens (filled at submission: their text
    /// is put back into the reply, which drops special tokens, so the parser sees them).
    pub marker_ids: Vec<(u32, &'static str)>,
}

impl ToolPlan {
    /// Whether calls are parsed from the reply (every choice but `none`).
    pub fn parses(&self) -> bool {
        self.choice != ToolChoice::None
    }

    /// The names a call may take.
    pub fn names(&self) -> Vec<String> {
        self.specs.iter().map(|s| s.name.clone()).collect()
    }
}

/// A function tool as sent: `{"type": "function", "function": {...}}`.
#[derive(Deserialize)]
struct ToolParam {
    #[serde(rename = "type")]
    kind: Option<String>,
    function: Option<Value>,
}

/// The function object.
#[derive(Deserialize)]
struct FunctionParam {
    name: Option<Value>,
    description: Option<Value>,
    parameters: Option<Value>,
    strict: Option<Value>,
}

/// The request's tool plan: `None` without tools (absent or `[]`), where `tool_choice` may only be `auto` or
/// `none`.
///
/// # Errors
/// A 400 naming `tools[i]...`, `tool_choice` or `parallel_tool_calls`.
pub fn plan(
    tools: &Field<Vec<Value>>,
    choice: Option<&Value>,
    parallel: &Field<bool>,
) -> Result<Option<ToolPlan>, ApiError> {
    let list = match tools {
        Field::Absent => Vec::new(),
        Field::Given(l) => l.clone(),
        Field::Wrong(_) => return Err(ApiError::invalid("tools", "`tools` must be a list of tools")),
    };
    if list.len() > MAX_TOOLS {
        return Err(ApiError::invalid(
            "tools",
            format!("at most {MAX_TOOLS} tools a request; this one sends {}", list.len()),
        ));
    }
    let mut functions = Vec::new();
    let mut specs: Vec<ToolSpec> = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let (function, spec) = tool(i, t)?;
        if specs.iter().any(|s| s.name == spec.name) {
            let msg = format!("the tool name {:?} is given twice", spec.name);
            return Err(ApiError::invalid(&format!("tools[{i}].function.name"), msg));
        }
        functions.push(function);
        specs.push(spec);
    }
    let choice = tool_choice(choice, &specs)?;
    let parallel = match parallel {
        Field::Absent => true,
        Field::Given(b) => *b,
        Field::Wrong(_) => {
            return Err(ApiError::invalid("parallel_tool_calls", "`parallel_tool_calls` must be true or false"));
        }
    };
    if specs.is_empty() {
        return Ok(None);
    }
    Ok(Some(ToolPlan { functions, specs, choice, parallel, marker_ids: Vec::new() }))
}

/// `tools[i]`: its function object (kept as sent) and its grammar spec.
fn tool(i: usize, t: &Value) -> Result<(Value, ToolSpec), ApiError> {
    let at = |k: &str| format!("tools[{i}]{k}");
    let t: ToolParam = serde_json::from_value(t.clone()).map_err(|_| {
        ApiError::invalid(&at(""), "each tool must be an object {\"type\": \"function\", \"function\": {...}}")
    })?;
    if t.kind.as_deref() != Some("function") {
        return Err(ApiError::invalid(&at(".type"), "`type` must be \"function\" (the only tool type served)"));
    }
    let function = t.function.ok_or_else(|| ApiError::invalid(&at(".function"), "`function` is required"))?;
    let f: FunctionParam = serde_json::from_value(function.clone())
        .map_err(|_| ApiError::invalid(&at(".function"), "`function` must be an object"))?;
    let name = match f.name {
        Some(Value::String(n)) if valid_name(&n) => n,
        Some(Value::String(n)) => {
            let msg = format!("the function name {n:?} must match ^[a-zA-Z0-9_-]{{1,64}}$");
            return Err(ApiError::invalid(&at(".function.name"), msg));
        }
        _ => return Err(ApiError::invalid(&at(".function.name"), "`function.name` is required (a string)")),
    };
    match f.description {
        None | Some(Value::Null) => {}
        Some(Value::String(d)) if d.len() <= MAX_DESCRIPTION => {}
        Some(Value::String(_)) => {
            let msg = format!("`description` is over {MAX_DESCRIPTION} bytes");
            return Err(ApiError::invalid(&at(".function.description"), msg));
        }
        Some(_) => return Err(ApiError::invalid(&at(".function.description"), "`description` must be a string")),
    }
    if f.strict.as_ref().is_some_and(|s| !s.is_boolean() && !s.is_null()) {
        return Err(ApiError::invalid(&at(".function.strict"), "`strict` must be true or false"));
    }
    let parameters = match f.parameters {
        None | Some(Value::Null) => Value::Null,
        Some(p) => schema(&p).map_err(|m| ApiError::invalid(&at(".function.parameters"), m))?,
    };
    Ok((function, ToolSpec { name, parameters }))
}

/// OpenAI's function-name rule: `^[a-zA-Z0-9_-]{1,64}$`.
pub fn valid_name(n: &str) -> bool {
    (1..=64).contains(&n.len()) && n.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_' || c == b'-')
}

/// `parameters`: a JSON object schema (an object; `type` "object" when given; `properties` an object of schemas;
/// `required` a list of strings). Deeper faults are llguidance's to find when a call is constrained.
fn schema(p: &Value) -> Result<Value, String> {
    let Value::Object(o) = p else { return Err("`parameters` must be a JSON Schema object".into()) };
    if o.get("type").is_some_and(|t| t != "object") {
        return Err("`parameters.type` must be \"object\" (a function takes named arguments)".into());
    }
    match o.get("properties") {
        None => {}
        Some(Value::Object(props)) if props.values().all(|s| s.is_object() || s.is_boolean()) => {}
        Some(_) => return Err("`parameters.properties` must map names to schemas".into()),
    }
    match o.get("required") {
        None => {}
        Some(Value::Array(r)) if r.iter().all(Value::is_string) => {}
        Some(_) => return Err("`parameters.required` must be a list of names".into()),
    }
    Ok(p.clone())
}

/// `tool_choice` against the offered tools (`specs` empty: no tools).
fn tool_choice(choice: Option<&Value>, specs: &[ToolSpec]) -> Result<ToolChoice, ApiError> {
    let k = "tool_choice";
    let parsed = match choice {
        None | Some(Value::Null) => ToolChoice::Auto,
        Some(Value::String(s)) => match s.as_str() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" => ToolChoice::Required,
            other => {
                let msg =
                    format!("`tool_choice` {other:?} is not one of \"auto\", \"none\", \"required\" or a function");
                return Err(ApiError::invalid(k, msg));
            }
        },
        Some(v @ Value::Object(_)) => {
            let name = (v.get("type").and_then(Value::as_str) == Some("function"))
                .then(|| v.pointer("/function/name").and_then(Value::as_str))
                .flatten()
                .ok_or_else(|| {
                    ApiError::invalid(
                        k,
                        "a named `tool_choice` is {\"type\": \"function\", \"function\": {\"name\": ...}}",
                    )
                })?;
            ToolChoice::Named(name.to_string())
        }
        Some(_) => return Err(ApiError::invalid(k, "`tool_choice` must be a string or an object")),
    };
    match &parsed {
        ToolChoice::Required | ToolChoice::Named(_) if specs.is_empty() => Err(ApiError::invalid(
            k,
            "`tool_choice` \"required\" or a named function is only allowed when `tools` are given",
        )),
        ToolChoice::Named(n) if !specs.iter().any(|s| &s.name == n) => {
            Err(ApiError::invalid(k, format!("`tool_choice` names {n:?}, which is not one of the `tools`")))
        }
        _ => Ok(parsed),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn weather() -> Value {
        json!({"type": "function", "function": {"name": "get_weather", "description": "Weather now.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}})
    }

    fn run(tools: Value, choice: Option<Value>) -> Result<Option<ToolPlan>, (Option<String>, String)> {
        plan(&Field::from_value(tools), choice.as_ref(), &Field::Absent).map_err(|e| (e.param, e.message))
    }

    #[test]
    fn a_valid_plan_keeps_the_function_objects() {
        let p = run(json!([weather()]), None).unwrap().unwrap();
        assert_eq!(p.functions, vec![weather()["function"].clone()]);
        assert_eq!(
            (p.choice.clone(), p.parallel, p.names()),
            (ToolChoice::Auto, true, vec!["get_weather".to_string()])
        );
        let named = json!({"type": "function", "function": {"name": "get_weather"}});
        assert_eq!(
            run(json!([weather()]), Some(named)).unwrap().unwrap().choice,
            ToolChoice::Named("get_weather".into())
        );
        assert_eq!(run(json!([]), Some(json!("auto"))), Ok(None));
        assert_eq!(run(json!(null), Some(json!("none"))), Ok(None));
    }

    #[test]
    fn bad_tools_are_named() {
        let f = |function: Value| json!([{"type": "function", "function": function}]);
        for (tools, choice, param, says) in [
            (json!({"a": 1}), None, "tools", "must be a list"),
            (json!([1]), None, "tools[0]", "must be an object"),
            (json!([{"type": "retrieval"}]), None, "tools[0].type", "\"function\""),
            (json!([{"type": "function"}]), None, "tools[0].function", "required"),
            (f(json!({"name": "get weather"})), None, "tools[0].function.name", "must match"),
            (f(json!({"name": "x".repeat(65)})), None, "tools[0].function.name", "must match"),
            (f(json!({"description": "d"})), None, "tools[0].function.name", "required"),
            (
                f(json!({"name": "a", "parameters": {"type": "string"}})),
                None,
                "tools[0].function.parameters",
                "\"object\"",
            ),
            (f(json!({"name": "a", "parameters": [1]})), None, "tools[0].function.parameters", "JSON Schema object"),
            (
                f(json!({"name": "a", "parameters": {"properties": {"x": 3}}})),
                None,
                "tools[0].function.parameters",
                "schemas",
            ),
            (f(json!({"name": "a", "description": 5})), None, "tools[0].function.description", "string"),
            (json!([weather(), weather()]), None, "tools[1].function.name", "given twice"),
            (json!(vec![weather(); MAX_TOOLS + 1]), None, "tools", "at most 128"),
            (json!([weather()]), Some(json!("always")), "tool_choice", "not one of"),
            (
                json!([weather()]),
                Some(json!({"type": "function", "function": {"name": "nope"}})),
                "tool_choice",
                "not one of the `tools`",
            ),
            (json!([weather()]), Some(json!({"type": "function"})), "tool_choice", "named"),
            (json!([]), Some(json!("required")), "tool_choice", "only allowed when `tools`"),
            (json!(null), Some(json!({"type": "function", "function": {"name": "a"}})), "tool_choice", "only allowed"),
        ] {
            let (p, m) = run(tools.clone(), choice).expect_err(&format!("{tools}"));
            assert_eq!(p.as_deref(), Some(param), "{m}");
            assert!(m.contains(says), "{param}: {m}");
        }
        let e = plan(&Field::from_value(json!([weather()])), None, &Field::Wrong(json!(1))).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("parallel_tool_calls"));
    }
}
