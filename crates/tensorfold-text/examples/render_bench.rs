//! Micro-benchmark (not a test) of one chat render on the default model's template: `cargo run --release -p
//! tensorfold-text --example render_bench [renders]` prints the mean time a render of a short chat takes, in
//! microseconds, and the time of one render of a 4 MiB chat (the request body's limit), in milliseconds. With a
//! second argument, the path of a `tensorfold` binary (`target/release/tensorfold`), it also renders the short chat
//! through one render worker of that binary (`render_pool`, as `tensorfold serve` does) and prints its mean.

use std::path::PathBuf;
use std::time::Instant;
use tensorfold_text::render_pool::{PoolConfig, RenderPool};
use tensorfold_text::{ChatMessage, Text};

fn main() {
    let renders: u32 = std::env::args().nth(1).and_then(|n| n.parse().ok()).unwrap_or(2000);
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/lfm2-moe-pycode");
    let Ok(Some(text)) = Text::open(&dir) else {
        eprintln!("cannot open the default model's text at {}", dir.display());
        std::process::exit(1);
    };
    let chat = [
        ChatMessage::new("system", "You are a helpful assistant."),
        ChatMessage::new("user", "Write a function that reverses a list."),
        ChatMessage::new("assistant", "def rev(xs):\n    return xs[::-1]"),
        ChatMessage::new("user", "Now in place."),
    ];
    let mut bytes = 0;
    let start = Instant::now();
    for _ in 0..renders {
        bytes += text.render_chat(&chat, true).map_or(0, |s| s.len());
    }
    let mean = start.elapsed().as_secs_f64() * 1e6 / f64::from(renders);
    println!("{renders} renders, {} bytes each: {mean:.1} us a render", bytes / renders as usize);
    if let Some(program) = std::env::args().nth(2) {
        let config = PoolConfig { program: program.into(), args: vec!["render-worker".into()], workers: 1 };
        let pool = RenderPool::new(config);
        // The first render starts the worker and sends it the template: not counted.
        let first = pool.render_chat(&text, &chat, true, None);
        if first.as_deref().ok() != text.render_chat(&chat, true).as_deref().ok() {
            eprintln!("the worker's render differs or failed: {first:?}");
            std::process::exit(1);
        }
        let start = Instant::now();
        for _ in 0..renders {
            let _ = pool.render_chat(&text, &chat, true, None);
        }
        let mean = start.elapsed().as_secs_f64() * 1e6 / f64::from(renders);
        println!("{renders} renders through a render worker: {mean:.1} us a render");
    }
    let long: Vec<ChatMessage> =
        (0..1024).map(|i| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, "x".repeat(4096))).collect();
    let start = Instant::now();
    let len = text.render_chat(&long, true).map_or(0, |s| s.len());
    println!("one render of 1,024 messages of 4 KiB: {len} bytes in {:.1} ms", start.elapsed().as_secs_f64() * 1e3);
}
