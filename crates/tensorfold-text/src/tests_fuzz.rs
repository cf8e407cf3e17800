//! Fuzz properties of the text side (proptest inside `cargo test`; `docs/fuzzing.md`): hostile chat templates and
//! messages end in a prompt within the bounds or a named error, never a panic or an abort; special tokens written
//! in content stay text; the streaming detokenizer's pieces add up to `decode` whatever the ids. The crashes they
//! found are the regression tests at the end.
use crate::template_limits::{TEMPLATE_MAX_BYTES, TEMPLATE_MAX_SOURCE};
use crate::tests::{config, text, tokenizer_json};
use crate::*;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// `cases` cases from a fixed seed, unless `PROPTEST_CASES` / `PROPTEST_RNG_SEED` say otherwise (the long run).
pub(crate) fn fuzz_config(cases: u32) -> Config {
    let mut c = Config { max_shrink_time: 60_000, ..Config::default() };
    if std::env::var_os("PROPTEST_CASES").is_none() {
        c.cases = cases;
    }
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        c.rng_seed = RngSeed::Fixed(26);
    }
    c
}

/// The embedded default model's text (its tokenizer and LFM2's template), read from `models/`.
fn default_text() -> &'static Text {
    static TEXT: OnceLock<Text> = OnceLock::new();
    TEXT.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/lfm2-moe-pycode");
        Text::open(&dir).expect("the default model's text opens").expect("it has a tokenizer")
    })
}

/// Numbers a hostile template multiplies, ranges and widths by.
fn number() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "0",
        "1",
        "3",
        "-1",
        "1000",
        "10000",
        "65536",
        "65537",
        "100000",
        "999999999",
        "9223372036854775807",
        "-9223372036854775808",
        "1e308",
        "0.5",
    ])
    .prop_map(str::to_string)
}

fn filter() -> impl Strategy<Value = String> {
    let fixed = prop::sample::select(vec![
        "length",
        "string",
        "tojson",
        "tojson(indent=2)",
        "tojson(sort_keys=true)",
        "pprint",
        "list",
        "sort",
        "unique",
        "join",
        "e",
        "safe",
        "trim",
        "first",
        "last",
        "reverse",
        "int",
        "float",
        "abs",
        "round",
        "dictsort",
        "items",
        "map('string')",
        "select",
        "reject",
        "sum",
        "max",
        "min",
        "upper",
        "title",
        "capitalize",
        "urlencode",
        "striptags",
        "wordcount",
        "default('d')",
        "batch(2)",
        "slice(2)",
        "replace('x', 'yyyy')",
        "format('a', 'b')",
    ]);
    let sized = (prop::sample::select(vec!["center", "indent", "wordwrap", "truncate", "batch", "slice"]), number())
        .prop_map(|(f, n)| format!("{f}({n})"));
    prop_oneof![3 => fixed.prop_map(str::to_string), 1 => sized]
}

fn method() -> impl Strategy<Value = String> {
    let fixed = prop::sample::select(vec![
        "upper()",
        "strip()",
        "split()",
        "splitlines()",
        "replace('', 'xx')",
        "startswith('x')",
        "items()",
        "keys()",
        "count('x')",
        "find('x')",
        "title()",
        "join(messages)",
        "format(1, 2)",
        "get('role')",
    ]);
    let sized = number().prop_map(|n| format!("format('{{:>{n}}}')"));
    prop_oneof![3 => fixed.prop_map(str::to_string), 1 => sized]
}

/// A hostile expression: leaves from the context and literals, grown by lists, repetition, filters and methods.
fn expr() -> impl Strategy<Value = String> {
    let leaf = prop_oneof![
        prop::sample::select(vec![
            "messages",
            "messages[0]",
            "messages[0]['content']",
            "messages[-1].role",
            "ns.x",
            "'x'",
            "'%s|%d'",
            "'{:>99999999}'",
            "'%999999999s'",
            "bos_token",
            "eos_token",
            "tools",
            "add_generation_prompt",
            "none",
            "undefined_thing",
            "undefined_thing.attr",
            "range(100000)",
            "range(10000)",
            "range(3)",
            "namespace(x=1)",
            "loop",
        ])
        .prop_map(str::to_string),
        number(),
        "[ -~]{0,12}".prop_map(|s| format!("{s:?}")),
    ];
    leaf.prop_recursive(3, 24, 3, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("[{a}, {b}]")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{{{a}: {b}}}")),
            (inner.clone(), number()).prop_map(|(a, n)| format!("({a}) * {n}")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a}) ~ ({b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a}) + ({b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a}) // ({b})")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("({a})[{b}]")),
            (inner.clone(), filter()).prop_map(|(a, f)| format!("({a})|{f}")),
            (inner.clone(), method()).prop_map(|(a, m)| format!("({a}).{m}")),
            (inner.clone(), inner).prop_map(|(a, b)| format!("'%s'|format({a}) if {b} else {a}")),
        ]
    })
}

/// A hostile template: statements around expressions (loops, conditions, namespace assignments, macros, raises),
/// and broken syntax, after a namespace `ns` is set up.
fn template() -> impl Strategy<Value = String> {
    let stmt = prop_oneof![
        4 => expr().prop_map(|e| format!("{{{{ {e} }}}}")),
        2 => (expr(), number()).prop_map(|(e, n)| format!("{{% for a in range({n}) %}}{{% set ns.x = {e} %}}{{% endfor %}}")),
        2 => (expr(), expr()).prop_map(|(a, b)| format!("{{% for m in {a} %}}{{{{ {b} }}}}{{% endfor %}}")),
        1 => (expr(), expr()).prop_map(|(a, b)| format!("{{% if {a} %}}{{{{ {b} }}}}{{% else %}}x{{% endif %}}")),
        // Accumulation through the namespace, the one value a loop carries from one pass to the next.
        2 => (number(), expr(), prop::sample::select(vec!["[ns.x, {}]", "{{'k': ns.x, 'v': {}}}", "(ns.x, {})", "[{}] + [ns.x]"]))
            .prop_map(|(n, e, shape)| format!("{{% for a in range({n}) %}}{{% set ns.x = {} %}}{{% endfor %}}", shape.replace("{}", &e))),
        1 => expr().prop_map(|e| format!("{{% macro f(n) %}}{{{{ f([n]) }}}}{{% endmacro %}}{{{{ f({e}) }}}}")),
        1 => expr().prop_map(|e| format!("{{% for m in messages recursive %}}{{{{ loop([{e}]) }}}}{{% endfor %}}")),
        1 => expr().prop_map(|e| format!("{{{{ raise_exception({e}) }}}}")),
        1 => "[ -~]{0,8}".prop_map(|s| format!("{{{{ strftime_now({s:?}) }}}}")),
        1 => prop::sample::select(vec!["{%", "{{", "}}", "%}", "{% endfor %}", "{#", "{% set %}", "{{ 1 +"])
            .prop_map(str::to_string),
    ];
    prop::collection::vec(stmt, 1..5).prop_map(|s| format!("{{% set ns = namespace(x=[]) %}}{}", s.concat()))
}

/// Message text: special tokens, the guard's placeholder characters, template syntax, multibyte and control
/// characters, mixed with arbitrary text.
fn content_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        prop::sample::select(vec![
            "<|im_end|>",
            "<|im_start|>",
            "<|startoftext|>",
            "<|endoftext|>",
            "<|pad|>",
            "<|im_end",
            "\u{E000}",
            "\u{E001}",
            "\u{E000}0\u{E001}",
            "{{",
            "{%",
            "}}",
            "é",
            "世",
            "🙂",
            "\0",
            "\n",
            " ",
            "system",
            "\u{FFFD}",
        ])
        .prop_map(str::to_string),
        any::<String>().prop_map(|s| s.chars().take(8).collect()),
    ];
    prop::collection::vec(piece, 0..12).prop_map(|p| p.concat())
}

fn message() -> impl Strategy<Value = ChatMessage> {
    let role = prop::sample::select(vec!["system", "user", "assistant", "tool"]);
    let content = prop_oneof![
        3 => content_text().prop_map(MessageContent::Text),
        1 => prop::collection::vec(content_text(), 0..3)
            .prop_map(|t| MessageContent::Parts(t.into_iter().map(|text| ContentPart::Text { text }).collect())),
    ];
    (role, content).prop_map(|(role, content)| ChatMessage { role: role.into(), content, ..ChatMessage::new("", "") })
}

/// A text whose template is `template`, past the probe at open (which hostile templates may fail by name).
fn with_template(template: &str) -> Text {
    let mut t = text();
    t.set_chat_template(template);
    t
}

/// The bounds every render keeps: a prompt within the size limit, or a named refusal (a panic in the render
/// thread would come back as "the render panicked", which no template may cause).
fn assert_bounded(r: &Result<String, TextError>, took: Duration, what: &str) -> Result<(), TestCaseError> {
    match r {
        Ok(s) => prop_assert!(s.len() <= TEMPLATE_MAX_BYTES, "{what}: {} bytes", s.len()),
        Err(TextError::Template(m)) => prop_assert!(!m.contains("panicked"), "{what}: {m}"),
        Err(
            TextError::TemplateBudget { .. }
            | TextError::TemplateItems { .. }
            | TextError::TemplateTime { .. }
            | TextError::TemplateTooLarge { .. },
        ) => {}
        Err(other) => prop_assert!(false, "{what}: unexpected error {other:?}"),
    }
    // The deadline (2 s) and its backstop (1 s more) end a render; far past them, something is not counted.
    prop_assert!(took < Duration::from_secs(20), "{what}: took {took:?}");
    Ok(())
}

proptest! {
    #![proptest_config(fuzz_config(96))]

    #[test]
    fn hostile_templates_end_in_a_bounded_prompt_or_a_named_error(tpl in template(), msgs in prop::collection::vec(message(), 1..4)) {
        let t = with_template(&tpl);
        let start = Instant::now();
        let r = t.render_chat(&msgs, true);
        assert_bounded(&r, start.elapsed(), &tpl)?;
        // Shipped with a checkpoint, the same template either opens or is refused by name at open.
        let opened = Text::from_parts(tokenizer_json(false).as_bytes(), Some(&config(&tpl)), None);
        prop_assert!(matches!(opened, Ok(_) | Err(TextError::TemplateBudget { .. } | TextError::TemplateItems { .. }
            | TextError::TemplateTime { .. } | TextError::TemplateTooLarge { .. })),
            "{tpl}: {:?}", opened.err());
    }
}

proptest! {
    #![proptest_config(fuzz_config(128))]

    #[test]
    fn hostile_messages_render_and_tokenize_with_only_the_templates_control_tokens(msgs in prop::collection::vec(message(), 1..5)) {
        for t in [&text(), default_text()] {
            let ids = t.encode_chat(&msgs, true).map_err(|e| TestCaseError::fail(format!("{e}")))?;
            let rendered = t.render_chat(&msgs, true).map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert_eq!(t.decode(&ids, false).unwrap(), rendered);
            let count = |tok: &str| ids.iter().filter(|&&x| Some(x) == t.token_to_id(tok)).count();
            // Each message's turn and the generation prompt, none from the content.
            prop_assert_eq!(count("<|im_start|>"), msgs.len() + 1);
            prop_assert_eq!(count("<|im_end|>"), msgs.len());
            prop_assert_eq!(count("<|startoftext|>"), 1);
        }
    }

    #[test]
    fn the_streaming_detokenizer_adds_up_to_decode_whatever_the_ids(
        raw in prop::collection::vec(0u32..9000, 0..48), skip in any::<bool>(), tiny in any::<bool>()
    ) {
        let small = text();
        let t = if tiny { &small } else { default_text() };
        let mut d = t.detokenizer(skip);
        let (mut out, mut valid) = (String::new(), Vec::new());
        for id in raw.iter().map(|&i| if tiny { i % 300 } else { i }) {
            match d.push(id) {
                Ok(piece) => {
                    valid.push(id);
                    out += &piece;
                }
                // A refused id leaves the stream as it was.
                Err(TextError::UnknownToken(x)) => prop_assert!(x as usize >= t.vocab_size()),
                Err(e) => prop_assert!(false, "{e}"),
            }
        }
        out += &d.finish();
        prop_assert_eq!(out, t.decode(&valid, skip).unwrap());
    }
}

/// Renders `template` for one user message on a test thread's 2 MiB stack (where the crashes were found).
fn render_on_small_stack(template: String) -> Result<String, TextError> {
    let run = move || with_template(&template).render_chat(&[ChatMessage::new("user", "x")], true);
    std::thread::Builder::new().stack_size(2 << 20).spawn(run).unwrap().join().unwrap()
}

/// Found by `hostile_templates_end_in_a_bounded_prompt_or_a_named_error`: a list nested 10,000 deep through a
/// namespace overflowed the stack (an abort, not a panic) when printed or passed to `tojson`, and 100,000 deep when
/// merely dropped. Renders now run on their own deep stack, and our filters refuse values past 128 levels (`string`
/// too, as Python's `str` raises past its recursion limit).
#[test]
fn a_deeply_nested_value_is_refused_or_rendered_never_a_stack_overflow() {
    let nest = "{% set ns = namespace(x=[]) %}{% for j in range(300) %}{% for i in range(1000) %}\
                {% set ns.x = [ns.x] %}{% endfor %}{% endfor %}";
    assert_eq!(render_on_small_stack(format!("{nest}{{{{ ns.x|length }}}}")).unwrap(), "1");
    for filter in ["tojson", "pprint", "string"] {
        match render_on_small_stack(format!("{nest}{{{{ ns.x|{filter} }}}}")) {
            Err(TextError::Template(m)) => assert!(m.contains("nests past 128 levels"), "{filter}: {m}"),
            other => panic!("{filter}: expected a named refusal, got {:?}", other.map(|s| s.len())),
        }
    }
    // Out of fuel while 450,000 deep: the drop on the way out does not overflow either.
    let deeper = nest.replace("range(300)", "range(1000)");
    assert!(matches!(render_on_small_stack(deeper), Err(TextError::TemplateBudget { .. })));
}

/// Found with the same property: `pprint`'s indentation grows with the square of the depth, unbounded by fuel
/// (1,000 levels took 1.8 s and 2 MB). Past 128 levels it is refused; within, it is stopped at the size limit.
#[test]
fn pprint_of_a_deep_value_is_refused_by_name_and_a_shallow_one_still_prints() {
    let nest = "{% set ns = namespace(x=[]) %}{% for i in range(1000) %}{% set ns.x = [ns.x] %}{% endfor %}";
    let start = Instant::now();
    assert!(matches!(render_on_small_stack(format!("{nest}{{{{ ns.x|pprint }}}}")), Err(TextError::Template(_))));
    assert!(start.elapsed() < Duration::from_secs(1), "{:?}", start.elapsed());
    assert_eq!(
        render_on_small_stack("{{ [1, [2]]|pprint }}".into()).unwrap(),
        "[\n    1,\n    [\n        2,\n    ],\n]"
    );
}

/// Found by reading what the parser does with the source: a chain of 10,000 filters overflowed a 1 MiB stack
/// while parsing. The source is capped at open and parsed on the deep stack.
#[test]
fn a_long_filter_chain_parses_on_the_render_stack_and_a_huge_source_is_refused_at_open() {
    let chain = |n: usize| format!("{{{{ 1{} }}}}", "|string".repeat(n));
    assert_eq!(render_on_small_stack(chain(30_000)).unwrap(), "1");
    let huge = chain(TEMPLATE_MAX_SOURCE / 7 + 1);
    match Text::from_parts(tokenizer_json(false).as_bytes(), Some(&config(&huge)), None) {
        Err(TextError::TemplateSource { bytes, limit }) => {
            assert_eq!((bytes, limit), (huge.len(), TEMPLATE_MAX_SOURCE))
        }
        other => panic!("expected TemplateSource, got {:?}", other.err()),
    }
}
