//! A bounded reader of the call lists LFM2 writes between its tool-call markers: Python calls with keyword
//! arguments, `[get_weather(city="Paris"), now()]`, whose values are Python literals (strings in `'` or `"` with
//! Python's escapes, ints, floats, `True`/`False`/`None`, lists, tuples, dicts, nested), and the JSON form
//! `[{"name": ..., "arguments": {...}}]` (a dict literal is JSON's object). JSON's `true`/`false`/`null` are read
//! too (the constrained grammar writes them). The format is vLLM's `pythonic` / `lfm2` tool parsers'; nothing is
//! evaluated.

use serde_json::{Map, Number, Value};

/// Deepest nesting of lists, tuples and dicts in one value.
pub const MAX_DEPTH: usize = 32;

/// Most calls in one list.
pub const MAX_CALLS: usize = 128;

/// Longest call list read, in bytes (a longer one is returned as text).
pub const MAX_BYTES: usize = 1 << 20;

/// One call read from the list: the function's name and its keyword arguments.
#[derive(Clone, Debug, PartialEq)]
pub struct RawCall {
    /// The function's name.
    pub name: String,
    /// The arguments, in the order written.
    pub arguments: Map<String, Value>,
}

/// Why a list did not read: the byte offset and what was expected there.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("tool call list: {what} at byte {at}")]
pub struct LiteralError {
    /// Byte offset into the list's text.
    pub at: usize,
    /// What was wrong.
    pub what: &'static str,
}

/// Reads `text` (what is between the markers) as a list of calls.
///
/// # Errors
/// [`LiteralError`] for anything but a list of calls (or of `{"name", "arguments"}` objects), a value nested past
/// [`MAX_DEPTH`], more than [`MAX_CALLS`] calls, or more than [`MAX_BYTES`].
pub fn parse_calls(text: &str) -> Result<Vec<RawCall>, LiteralError> {
    if text.len() > MAX_BYTES {
        return Err(LiteralError { at: MAX_BYTES, what: "a call list past the size bound" });
    }
    let mut r = Reader { s: text.as_bytes(), at: 0 };
    r.expect(b'[', "`[` opening the call list")?;
    let mut calls = Vec::new();
    loop {
        r.skip_ws();
        if r.eat(b']') {
            break;
        }
        if calls.len() == MAX_CALLS {
            return Err(r.err("more calls than the bound"));
        }
        calls.push(r.call()?);
        r.skip_ws();
        if !r.eat(b',') {
            r.expect(b']', "`,` or `]` after a call")?;
            break;
        }
    }
    r.skip_ws();
    if r.at != r.s.len() {
        return Err(r.err("text after the call list"));
    }
    if calls.is_empty() {
        return Err(r.err("an empty call list"));
    }
    Ok(calls)
}

/// Reads all of `text` as one argument value (what the stream's reader hands over once a value has ended).
///
/// # Errors
/// [`LiteralError`] as [`parse_calls`] would give for this value, or text after it.
pub fn read_value(text: &str) -> Result<Value, LiteralError> {
    let mut r = Reader { s: text.as_bytes(), at: 0 };
    let v = r.value(0)?;
    r.end(v)
}

/// Reads all of `text` as one call (either form).
///
/// # Errors
/// [`LiteralError`] as [`parse_calls`] would give for this call, or text after it.
pub fn read_call(text: &str) -> Result<RawCall, LiteralError> {
    let mut r = Reader { s: text.as_bytes(), at: 0 };
    let c = r.call()?;
    r.end(c)
}

/// The characters of `body`, a run of a string quoted by `quote` that ends neither inside an escape nor at the
/// closing quote, with Python's escapes read (as [`parse_calls`] reads the whole string).
///
/// # Errors
/// [`LiteralError`] for a bad escape or a newline.
pub fn read_string_run(quote: u8, body: &str) -> Result<String, LiteralError> {
    let mut text = Vec::with_capacity(body.len() + 2);
    text.push(quote);
    text.extend_from_slice(body.as_bytes());
    text.push(quote);
    let mut r = Reader { s: &text, at: 0 };
    let s = r.string(quote)?;
    r.end(s)
}

struct Reader<'a> {
    s: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn err(&self, what: &'static str) -> LiteralError {
        LiteralError { at: self.at, what }
    }

    /// `v` when the whole text was read.
    fn end<T>(&self, v: T) -> Result<T, LiteralError> {
        if self.at == self.s.len() { Ok(v) } else { Err(self.err("text after the value")) }
    }

    fn peek(&self) -> Option<u8> {
        self.s.get(self.at).copied()
    }

    fn skip_ws(&mut self) {
        while self.peek().is_some_and(|c| c.is_ascii_whitespace()) {
            self.at += 1;
        }
    }

    fn eat(&mut self, c: u8) -> bool {
        let hit = self.peek() == Some(c);
        self.at += usize::from(hit);
        hit
    }

    fn expect(&mut self, c: u8, what: &'static str) -> Result<(), LiteralError> {
        self.skip_ws();
        if self.eat(c) { Ok(()) } else { Err(self.err(what)) }
    }

    /// A name: `[A-Za-z0-9_.-]+` (OpenAI's function-name characters and `.`).
    fn name(&mut self) -> Result<String, LiteralError> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'-')) {
            self.at += 1;
        }
        if self.at == start {
            return Err(self.err("a name"));
        }
        Ok(String::from_utf8_lossy(&self.s[start..self.at]).into_owned())
    }

    /// `name(key=value, ...)` or `{"name": ..., "arguments": {...}}`.
    fn call(&mut self) -> Result<RawCall, LiteralError> {
        if self.peek() == Some(b'{') {
            return self.json_call();
        }
        let name = self.name()?;
        self.expect(b'(', "`(` after the function name")?;
        let mut arguments = Map::new();
        loop {
            self.skip_ws();
            if self.eat(b')') {
                return Ok(RawCall { name, arguments });
            }
            let key = self.name()?;
            self.expect(b'=', "`=` after an argument name (arguments are keywords)")?;
            self.skip_ws();
            let value = self.value(0)?;
            if arguments.insert(key, value).is_some() {
                return Err(self.err("an argument given twice"));
            }
            self.skip_ws();
            if !self.eat(b',') {
                self.expect(b')', "`,` or `)` after an argument")?;
                return Ok(RawCall { name, arguments });
            }
        }
    }

    /// The JSON form's object: `name` a string, `arguments` an object (or JSON text of one), nothing else.
    fn json_call(&mut self) -> Result<RawCall, LiteralError> {
        let at = self.at;
        let bad = |what| LiteralError { at, what };
        let Value::Object(mut o) = self.value(0)? else { return Err(bad("a call object")) };
        let name = match o.remove("name") {
            Some(Value::String(n)) => n,
            _ => return Err(bad("a call object without a string `name`")),
        };
        let arguments = match o.remove("arguments").or_else(|| o.remove("parameters")) {
            Some(Value::Object(a)) => a,
            Some(Value::String(s)) => match serde_json::from_str(&s) {
                Ok(Value::Object(a)) => a,
                _ => return Err(bad("`arguments` text that is not a JSON object")),
            },
            None => Map::new(),
            Some(_) => return Err(bad("`arguments` that is not an object")),
        };
        if !o.is_empty() {
            return Err(bad("a call object with keys other than `name` and `arguments`"));
        }
        Ok(RawCall { name, arguments })
    }

    fn value(&mut self, depth: usize) -> Result<Value, LiteralError> {
        if depth > MAX_DEPTH {
            return Err(self.err("a value nested past the bound"));
        }
        match self.peek() {
            Some(q @ (b'"' | b'\'')) => self.string(q).map(Value::String),
            Some(b'[') => self.sequence(b']', depth),
            Some(b'(') => self.sequence(b')', depth),
            Some(b'{') => self.dict(depth),
            Some(c) if c == b'-' || c == b'+' || c == b'.' || c.is_ascii_digit() => self.number(),
            Some(c) if c.is_ascii_alphabetic() => {
                let at = self.at;
                match self.name()?.as_str() {
                    "True" | "true" => Ok(Value::Bool(true)),
                    "False" | "false" => Ok(Value::Bool(false)),
                    "None" | "null" => Ok(Value::Null),
                    _ => Err(LiteralError { at, what: "a literal (a bare name is not one)" }),
                }
            }
            _ => Err(self.err("a value")),
        }
    }

    /// A list `[...]` or a tuple `(...)`, both JSON lists; a trailing comma is allowed.
    fn sequence(&mut self, close: u8, depth: usize) -> Result<Value, LiteralError> {
        self.at += 1;
        let mut items = Vec::new();
        loop {
            self.skip_ws();
            if self.eat(close) {
                return Ok(Value::Array(items));
            }
            items.push(self.value(depth + 1)?);
            self.skip_ws();
            if !self.eat(b',') {
                self.expect(close, "`,` or the closing bracket")?;
                return Ok(Value::Array(items));
            }
        }
    }

    /// A dict `{key: value, ...}`: keys are strings (JSON's object keys).
    fn dict(&mut self, depth: usize) -> Result<Value, LiteralError> {
        self.at += 1;
        let mut map = Map::new();
        loop {
            self.skip_ws();
            if self.eat(b'}') {
                return Ok(Value::Object(map));
            }
            let key = match self.peek() {
                Some(q @ (b'"' | b'\'')) => self.string(q)?,
                _ => return Err(self.err("a string key")),
            };
            self.expect(b':', "`:` after a key")?;
            self.skip_ws();
            map.insert(key, self.value(depth + 1)?);
            self.skip_ws();
            if !self.eat(b',') {
                self.expect(b'}', "`,` or `}`")?;
                return Ok(Value::Object(map));
            }
        }
    }

    /// An int or a float, Python's spelling (`1`, `-2`, `3.5`, `.5`, `1e-3`, `1_000`); an int past 64 bits
    /// becomes the nearest float, as JSON readers take it.
    fn number(&mut self) -> Result<Value, LiteralError> {
        let start = self.at;
        while self.peek().is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'+' | b'_')) {
            self.at += 1;
        }
        let text: String = String::from_utf8_lossy(&self.s[start..self.at]).replace('_', "");
        let bad = LiteralError { at: start, what: "a number" };
        let digits = text.trim_start_matches(['-', '+']);
        if !digits.starts_with(|c: char| c.is_ascii_digit() || c == '.') {
            return Err(bad);
        }
        if let Ok(i) = text.parse::<i64>() {
            return Ok(Value::from(i));
        }
        if let Ok(u) = text.parse::<u64>() {
            return Ok(Value::from(u));
        }
        let f = text.parse::<f64>().map_err(|_| bad.clone())?;
        Number::from_f64(f).map(Value::Number).ok_or(bad)
    }

    /// A string in `quote`, with Python's escapes (`\\n \\t \\r \\b \\f \\v \\0 \\a \\xHH \\uXXXX \\UXXXXXXXX`, a
    /// backslash before a quote, a backslash or a newline); an unknown escape keeps its backslash, as Python does.
    fn string(&mut self, quote: u8) -> Result<String, LiteralError> {
        let start = self.at;
        self.at += 1;
        let mut out = Vec::new();
        loop {
            let Some(c) = self.peek() else {
                return Err(LiteralError { at: start, what: "an unterminated string" });
            };
            self.at += 1;
            match c {
                c if c == quote => break,
                b'\\' => self.escape(&mut out)?,
                b'\n' => return Err(LiteralError { at: start, what: "a newline inside a string" }),
                c => out.push(c),
            }
        }
        String::from_utf8(out).map_err(|_| LiteralError { at: start, what: "a string that is not UTF-8" })
    }

    fn escape(&mut self, out: &mut Vec<u8>) -> Result<(), LiteralError> {
        let Some(c) = self.peek() else { return Err(self.err("an escape at the end")) };
        self.at += 1;
        let simple = match c {
            b'n' => Some(b'\n'),
            b't' => Some(b'\t'),
            b'r' => Some(b'\r'),
            b'b' => Some(8),
            b'f' => Some(12),
            b'v' => Some(11),
            b'a' => Some(7),
            b'0' => Some(0),
            b'\\' | b'\'' | b'"' | b'/' => Some(c),
            b'\n' => return Ok(()),
            _ => None,
        };
        if let Some(b) = simple {
            out.push(b);
            return Ok(());
        }
        let width = match c {
            b'x' => 2,
            b'u' => 4,
            b'U' => 8,
            _ => {
                out.extend_from_slice(&[b'\\', c]);
                return Ok(());
            }
        };
        let ch = self.hex_char(width)?;
        let mut buf = [0u8; 4];
        out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
        Ok(())
    }

    /// `width` hex digits as a character (a `\\uD83D\\uDE00` surrogate pair, as JSON writes one, joins).
    fn hex_char(&mut self, width: usize) -> Result<char, LiteralError> {
        let code = self.hex(width)?;
        if (0xD800..0xDC00).contains(&code) && self.s[self.at..].starts_with(b"\\u") {
            self.at += 2;
            let low = self.hex(4)?;
            if (0xDC00..0xE000).contains(&low) {
                let joined = 0x10000 + ((code - 0xD800) << 10) + (low - 0xDC00);
                return char::from_u32(joined).ok_or_else(|| self.err("a valid code point"));
            }
        }
        char::from_u32(code).ok_or_else(|| self.err("a valid code point"))
    }

    fn hex(&mut self, width: usize) -> Result<u32, LiteralError> {
        let digits = self.s.get(self.at..self.at + width).ok_or_else(|| self.err("hex digits"))?;
        if !digits.iter().all(u8::is_ascii_hexdigit) {
            return Err(self.err("hex digits")); // from_str_radix alone would take a leading '+'
        }
        let text = std::str::from_utf8(digits).map_err(|_| self.err("hex digits"))?;
        let code = u32::from_str_radix(text, 16).map_err(|_| self.err("hex digits"))?;
        self.at += width;
        Ok(code)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn args(text: &str) -> Vec<(String, Value)> {
        parse_calls(text).unwrap().into_iter().map(|c| (c.name, Value::Object(c.arguments))).collect()
    }

    #[test]
    fn python_literals_read_as_json() {
        let got = args(
            r#"[f(s='it\'s, [x]', d="a\"b\\c\n", i=-3, big=12345678901234567890123, x=1.5e3, t=True, n=None,
                l=[1, (2, 3), {'k': [False]}], e={}, u="\u00e9\x41")]"#,
        );
        assert_eq!(got[0].0, "f");
        assert_eq!(
            got[0].1,
            json!({"s": "it's, [x]", "d": "a\"b\\c\n", "i": -3, "big": 1.2345678901234568e22, "x": 1500.0, "t": true,
                   "n": null, "l": [1, [2, 3], {"k": [false]}], "e": {}, "u": "éA"})
        );
    }

    #[test]
    fn several_calls_and_the_json_form() {
        let got = args(r#"[get_weather(city="Paris"), now(), get_time(zone='UTC',)]"#);
        assert_eq!(got.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(), ["get_weather", "now", "get_time"]);
        assert_eq!(got[2].1, json!({"zone": "UTC"}));
        let got = args(r#"[{"name": "get_weather", "arguments": {"city": "Oslo", "days": [1, 2]}}, {"name": "now"}]"#);
        assert_eq!(got[0], ("get_weather".into(), json!({"city": "Oslo", "days": [1, 2]})));
        assert_eq!(got[1], ("now".into(), json!({})));
        let got = args(r#"[{"name": "f", "arguments": "{\"a\": true}"}]"#);
        assert_eq!(got[0].1, json!({"a": true}));
    }

    #[test]
    fn malformed_lists_are_errors_not_panics() {
        for bad in [
            "",
            "[",
            "[]",
            "get_weather(city='x')",
            "[f(1)]",
            "[f(a=1, a=2)]",
            "[f(a=x)]",
            "[f(a='unterminated)]",
            "[f(a=1) g()]",
            "[f(a=1)] trailing",
            "[f(a={1: 2})]",
            "[f(a=1e999)]",
            "[f(a=\"\\x4\")]",
            "[f(a=\"\\x+4\")]",
            "[f(a=\"\\uD800\")]",
            "[{\"name\": 3}]",
            "[{\"name\": \"f\", \"extra\": 1}]",
            "[f(a=-)]",
        ] {
            assert!(parse_calls(bad).is_err(), "{bad:?} read");
        }
        let deep = format!("[f(a={}{})]", "[".repeat(MAX_DEPTH + 2), "]".repeat(MAX_DEPTH + 2));
        assert_eq!(parse_calls(&deep).unwrap_err().what, "a value nested past the bound");
        let ok = format!("[f(a={}{})]", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(parse_calls(&ok).is_ok());
        let many = format!("[{}]", vec!["f()"; MAX_CALLS + 1].join(", "));
        assert_eq!(parse_calls(&many).unwrap_err().what, "more calls than the bound");
    }
}
