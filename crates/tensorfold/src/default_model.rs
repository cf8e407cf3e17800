//! The embedded default model: a small checkpoint compiled into the binary, so `tensorfold generate`
//! runs with no download. Until the trained default lands (issue 6) it is the `lfm2-moe-f32` fixture.

use std::path::PathBuf;
use tensorfold_model::Source;

macro_rules! embed {
    ($($name:literal),*) => {
        &[$(($name, include_bytes!(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/lfm2-moe-f32/", $name)) as &[u8])),*]
    };
}

static FILES: &[(&str, &[u8])] = embed!(
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "model.safetensors.index.json",
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors"
);

/// The model directory given, or the embedded default.
pub fn source(dir: Option<PathBuf>) -> Source {
    match dir {
        Some(d) => Source::Dir(d),
        None => Source::Embedded(FILES),
    }
}
