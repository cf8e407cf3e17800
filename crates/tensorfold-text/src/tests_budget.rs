//! Tests of the render budget beside fuel (`render_budget`, `template_render`): templates whose single steps do
//! O(n) work (the 345.9 s fuzz case, hashing and comparing large values in a loop, doubling, sorting, `in`) end
//! within seconds by name; our filters' walks stop on shared lists; the compiled template renders as before.
use crate::render_budget::{MAX_RANGE, TEMPLATE_DEADLINE, TEMPLATE_MAX_ITEMS};
use crate::template_render::BACKSTOP_GRACE;
use crate::tests::{config, text, tokenizer_json};
use crate::*;
use std::time::{Duration, Instant};

/// Renders `template` for one user message past the probe at open, with how long it took.
fn timed(template: &str) -> (Result<String, TextError>, Duration) {
    let mut t = text();
    t.set_chat_template(template);
    let start = Instant::now();
    let r = t.render_chat(&[ChatMessage::new("user", "x")], true);
    (r, start.elapsed())
}

/// The deadline plus a margin for a loaded machine: what "ends within seconds" means here.
fn soon() -> Duration {
    TEMPLATE_DEADLINE + Duration::from_millis(1500)
}

/// The template the long fuzz run found (seed 20261203): 345.9 s within fuel, hashing a dict keyed by
/// `range(100000)` once a pass of a 65,537-pass loop.
const FOUND: &str = r#"{% set ns = namespace(x=[]) %}{% for a in range(65537) %}{% set ns.x = {{range(100000): "9j<2:dB@'%/V"}: ("") + ("Bg.3")} %}{% endfor %}%}{{ raise_exception(({"\"m8|": 0})[((messages) // (ns.x)).format('{:>65536}')]) }}"#;

#[test]
fn the_fuzz_found_template_is_refused_at_once_and_its_in_cap_variant_by_its_item_budget() {
    let (r, took) = timed(FOUND);
    match r {
        Err(TextError::Template(m)) => assert!(m.contains(&format!("range has over {MAX_RANGE} items")), "{m}"),
        other => panic!("expected the range cap, got {other:?}"),
    }
    assert!(took < soon(), "{took:?}");
    // Within the cap, the same shape: each pass hashes 10,000 range items, and the ranges' budget ends it.
    let within = FOUND.replace("range(65537)", "range(6553)").replace("range(100000)", "range(10000)");
    let (r, took) = timed(&within);
    assert!(matches!(r, Err(TextError::TemplateItems { limit: TEMPLATE_MAX_ITEMS })), "{r:?}");
    assert!(took < soon(), "{took:?}");
    // Shipped with a checkpoint, it is refused at open by the probe render.
    let opened = Text::from_parts(tokenizer_json(false).as_bytes(), Some(&config(&within)), None);
    assert!(matches!(opened, Err(TextError::TemplateItems { .. })), "{:?}", opened.err());
}

#[test]
fn comparing_or_hashing_large_strings_once_a_pass_stops_at_the_deadline() {
    let big = "{% set s = 'x' * 100000000 %}{% set t = 'x' * 100000000 %}";
    for body in ["{% if s == t %}{% endif %}", "{% set d = {s: 1} %}", "{% if s in {t: 1} %}{% endif %}"] {
        let tpl = format!("{big}{{% for a in range(10000) %}}{body}{{% endfor %}}");
        let (r, took) = timed(&tpl);
        assert!(matches!(r, Err(TextError::TemplateTime { .. })), "{body}: {r:?}");
        assert!(took < soon(), "{body}: {took:?}");
    }
}

#[test]
fn doubling_sorting_joining_and_in_over_large_values_end_by_name() {
    let cases = [
        // A string doubled 30 times is 2 GiB: fuel charges its bytes, so it stops near 256 MB.
        "{% set ns = namespace(x='ab') %}{% for i in range(30) %}{% set ns.x = ns.x ~ ns.x %}{% endfor %}",
        "{% set l = range(10000)|list %}{% for a in range(1000) %}{{ l|sort|join(',')|length }}{% endfor %}",
        "{% set l = range(10000)|list %}{% for a in range(10000) %}{% if 9999 in l %}{% endif %}{% endfor %}",
        "{% for a in range(10000) %}{% for b in range(10000) %}{% if b in range(10000) %}{% endif %}{% endfor %}\
         {% endfor %}",
    ];
    for tpl in cases {
        let (r, took) = timed(tpl);
        assert!(
            matches!(
                r,
                Err(TextError::TemplateBudget { .. }
                    | TextError::TemplateItems { .. }
                    | TextError::TemplateTime { .. })
            ),
            "{tpl}: {r:?}"
        );
        assert!(took < soon(), "{tpl}: {took:?}");
    }
}

#[test]
fn our_filters_refuse_a_list_shared_into_itself_before_walking_it() {
    // 2^30 items reached through 30 levels: within the depth limit, hours to walk whole.
    let shared = "{% set ns = namespace(x='ab') %}{% for i in range(30) %}{% set ns.x = [ns.x, ns.x] %}{% endfor %}";
    for filter in ["tojson", "string", "pprint"] {
        let (r, took) = timed(&format!("{shared}{{{{ ns.x|{filter}|length }}}}"));
        match r {
            Err(TextError::Template(m)) => assert!(m.contains("holds over"), "{filter}: {m}"),
            other => panic!("{filter}: expected a named refusal, got {:?}", other.map(|s| s.len())),
        }
        assert!(took < soon(), "{filter}: {took:?}");
    }
    // A lazy list of 100M items (minijinja's `*` on a list) is refused the same way, before it is collected.
    for filter in ["tojson", "string", "pprint"] {
        let (r, took) = timed(&format!("{{{{ ([0] * 100000000)|{filter}|length }}}}"));
        assert!(matches!(&r, Err(TextError::Template(m)) if m.contains("holds over")), "{filter}: {r:?}");
        assert!(took < soon(), "{filter}: {took:?}");
    }
    // A list of a few shared items still prints.
    let (r, _) = timed("{% set a = ['x'] %}{{ [a, a]|tojson }} {{ [a, a]|string }}");
    assert_eq!(r.unwrap(), r#"[["x"], ["x"]] [['x'], ['x']]"#);
}

/// The backstop: one of minijinja's own steps (hashing a lazy list of 100M items, several seconds) cannot be
/// stopped from our calls. The caller still gets the named error at the deadline plus the grace, and the template
/// is refused while that render still runs, so no second request starts another such render.
#[test]
fn a_render_stuck_inside_one_step_is_given_up_at_the_backstop_and_the_template_refused() {
    let mut t = text();
    t.set_chat_template("{% set l = [0] * 100000000 %}{{ {l: 1}|length }}");
    let msgs = [ChatMessage::new("user", "x")];
    let start = Instant::now();
    assert!(matches!(t.render_chat(&msgs, true), Err(TextError::TemplateTime { .. })));
    let took = start.elapsed();
    assert!(took >= TEMPLATE_DEADLINE + BACKSTOP_GRACE && took < soon() + BACKSTOP_GRACE, "{took:?}");
    let again = Instant::now();
    assert!(matches!(t.render_chat(&msgs, true), Err(TextError::TemplateTime { .. })));
    assert!(again.elapsed() < Duration::from_millis(100), "{:?}", again.elapsed());
}

#[test]
fn ranges_within_the_cap_iterate_as_python_ranges() {
    let (r, _) = timed("{{ range(4)|list }} {{ range(2, 5)|list }} {{ range(5, 0, -2)|list }} {{ range(3, 1)|list }}");
    assert_eq!(r.unwrap(), "[0, 1, 2, 3] [2, 3, 4] [5, 3, 1] []");
    let (r, _) = timed(&format!("{{{{ range({MAX_RANGE})|length }}}} {{{{ range(0, 1, 0) }}}}"));
    assert!(matches!(&r, Err(TextError::Template(m)) if m.contains("step of 0")), "{r:?}");
    let (r, _) = timed(&format!("{{{{ range({MAX_RANGE})|length }}}}"));
    assert_eq!(r.unwrap(), MAX_RANGE.to_string());
}

/// The compiled template is kept in the text and used from several threads at once (the server's text pool);
/// each render gives the same bytes as one on a freshly opened text.
#[test]
fn the_compiled_template_is_shared_and_renders_the_same_prompt_each_time() {
    fn shared<T: Send + Sync>(_: &T) {}
    let t = text();
    shared(&t);
    let msgs = [ChatMessage::new("system", "s"), ChatMessage::new("user", "hi")];
    let fresh = text().render_chat(&msgs, true).unwrap();
    assert!(fresh.ends_with("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), "{fresh}");
    let renders: Vec<String> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..4).map(|_| s.spawn(|| t.render_chat(&msgs, true).unwrap())).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(renders.iter().all(|r| *r == fresh), "{renders:?}");
}
