//! Models by Hugging Face hub id: `serve Org/Name[@revision]` resolves the local hub cache through `hf-hub`'s cache
//! API (the layout `huggingface_hub` writes: `models--Org--Name/refs/<revision>` holds a commit, whose files are under
//! `snapshots/<commit>/`), and downloads into that cache with `hf-hub`'s blocking API when the repo is not there and
//! the hub is reachable. The cache root follows `huggingface_hub`: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
//! `XDG_CACHE_HOME/huggingface/hub`, else `~/.cache/huggingface/hub`; `HF_HUB_OFFLINE=1` never downloads and
//! `HF_ENDPOINT` replaces `https://huggingface.co`. The served name is the repo id, for a snapshot path too.

use hf_hub::{Cache, Repo, RepoType};
use std::path::{Path, PathBuf};

/// Where downloads come from unless `HF_ENDPOINT` says otherwise.
pub const DEFAULT_ENDPOINT: &str = "https://huggingface.co";

/// The files a download fetches: configs, tokenizer, chat template and safetensors weights (other formats skipped).
const WANTED: &[&str] = &[
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "model.safetensors.index.json",
];

/// A hub model reference: `Org/Name`, at `revision` (a branch, tag or commit; default `main`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HubId {
    /// `Org/Name`.
    pub repo: String,
    /// `main` unless `@revision` was given.
    pub revision: String,
}

/// Why a hub model could not be served.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// Not in the cache, and not downloaded (offline, or the download failed: `why`).
    #[error(
        "`{repo}` (revision {revision}) is not a model directory, and the Hugging Face cache has no snapshot of it: \
         looked at {looked}; {why}"
    )]
    NotCached { repo: String, revision: String, looked: String, why: String },
    /// A snapshot that lacks files the model needs, or a cache with interrupted downloads.
    #[error(
        "the cached snapshot {snapshot} of `{repo}` is incomplete ({what}); finish the download (`hf download \
         {repo}`) or delete the repo's folder and download it again"
    )]
    Partial { repo: String, snapshot: PathBuf, what: String },
}

impl HubId {
    /// Reads `Org/Name` or `Org/Name@revision`; `None` for anything else (a path, `synthetic:...`). The names take
    /// the hub's characters (letters, digits, `-`, `_`, `.`), and neither part may be `.` or `..`.
    pub fn parse(s: &str) -> Option<Self> {
        let (repo, revision) = match s.split_once('@') {
            Some((r, rev)) if !rev.is_empty() && !rev.contains(char::is_whitespace) => (r, rev),
            Some(_) => return None,
            None => (s, "main"),
        };
        let (org, name) = repo.split_once('/')?;
        let part = |p: &str| {
            !p.is_empty()
                && p != "."
                && p != ".."
                && p.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        (part(org) && part(name)).then(|| Self { repo: repo.to_string(), revision: revision.to_string() })
    }

    fn repo(&self) -> Repo {
        Repo::with_revision(self.repo.clone(), RepoType::Model, self.revision.clone())
    }

    /// The repo's folder in the cache: `models--Org--Name`.
    fn folder(&self, root: &Path) -> PathBuf {
        root.join(self.repo().folder_name())
    }
}

/// The hub cache root, as `huggingface_hub` finds it (see the module doc); `None` only without any of the variables
/// and without a home directory.
pub fn cache_root() -> Option<PathBuf> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(c) = var("HF_HUB_CACHE") {
        return Some(c);
    }
    let home = var("HF_HOME")
        .or_else(|| var("XDG_CACHE_HOME").map(|x| x.join("huggingface")))
        .or_else(|| var("HOME").map(|h| h.join(".cache/huggingface")))?;
    Some(home.join("hub"))
}

/// The snapshot of `id` in the cache at `root`, checked complete. Errors: [`HubError::NotCached`] naming the ref and
/// snapshot paths looked at (`why` left for the caller), [`HubError::Partial`].
pub fn cached(id: &HubId, root: &Path) -> Result<PathBuf, HubError> {
    let folder = id.folder(root);
    let by_ref = Cache::new(root.to_path_buf())
        .repo(id.repo())
        .get("config.json")
        .and_then(|c| c.parent().map(Path::to_path_buf));
    // A commit hash as the revision names its snapshot directly (there is no ref file for it).
    let with_config = |d: PathBuf| d.join("config.json").is_file().then_some(d);
    // hf-hub reads the ref untrimmed: a ref written with a newline still names its commit.
    let by_trimmed_ref = || {
        let commit = std::fs::read_to_string(folder.join("refs").join(&id.revision)).ok()?;
        with_config(folder.join("snapshots").join(commit.trim()))
    };
    let by_commit = folder.join("snapshots").join(&id.revision);
    let snapshot = by_ref.or_else(by_trimmed_ref).or_else(|| with_config(by_commit.clone()));
    let Some(snapshot) = snapshot else {
        let refs = folder.join("refs").join(&id.revision);
        let looked = match std::fs::read_to_string(&refs) {
            Ok(commit) => format!(
                "{} (commit {}), whose snapshot {} has no config.json",
                refs.display(),
                commit.trim(),
                folder.join("snapshots").join(commit.trim()).display()
            ),
            Err(_) => format!("{} and {}", refs.display(), by_commit.display()),
        };
        return Err(HubError::NotCached {
            repo: id.repo.clone(),
            revision: id.revision.clone(),
            looked,
            why: String::new(),
        });
    };
    check_complete(id, &folder, &snapshot)?;
    Ok(snapshot)
}

/// Refuses a snapshot without its weights (the file, or every shard of the index; a link whose blob is gone counts
/// as missing) and a repo folder with interrupted downloads (`blobs/*.incomplete`, hf-hub's `blobs/*.part`).
fn check_complete(id: &HubId, folder: &Path, snapshot: &Path) -> Result<(), HubError> {
    let partial = |what: String| HubError::Partial { repo: id.repo.clone(), snapshot: snapshot.to_path_buf(), what };
    let mut missing = Vec::new();
    match std::fs::read_to_string(snapshot.join("model.safetensors.index.json")) {
        Ok(index) => {
            let v: serde_json::Value = serde_json::from_str(&index)
                .map_err(|e| partial(format!("model.safetensors.index.json does not parse: {e}")))?;
            let mut shards: Vec<&str> =
                v["weight_map"].as_object().into_iter().flat_map(|m| m.values()).filter_map(|f| f.as_str()).collect();
            shards.sort_unstable();
            shards.dedup();
            missing.extend(shards.into_iter().filter(|s| !snapshot.join(s).is_file()).map(str::to_string));
        }
        Err(_) if !snapshot.join("model.safetensors").is_file() => missing.push("model.safetensors".to_string()),
        Err(_) => {}
    }
    let incomplete: Vec<String> = std::fs::read_dir(folder.join("blobs"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".incomplete") || n.ends_with(".part"))
        .collect();
    match (missing.is_empty(), incomplete.is_empty()) {
        (true, true) => Ok(()),
        (false, _) => Err(partial(format!("missing {}", missing.join(", ")))),
        (true, false) => Err(partial(format!("interrupted downloads in blobs/: {}", incomplete.join(", ")))),
    }
}

/// `Org/Name` of a snapshot path inside a hub cache (`.../models--Org--Name/snapshots/<commit>`), else `None`.
pub fn repo_of_path(dir: &Path) -> Option<String> {
    let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let parts: Vec<String> = dir.components().map(|c| c.as_os_str().to_string_lossy().into_owned()).collect();
    let at = parts.iter().rposition(|p| p == "snapshots")?;
    let (org, name) = parts.get(at.checked_sub(1)?)?.strip_prefix("models--")?.split_once("--")?;
    (!org.is_empty() && !name.is_empty() && at + 2 == parts.len()).then(|| format!("{org}/{name}"))
}

/// The snapshot of `id`: the cache's, else downloaded into the cache when `HF_HUB_OFFLINE` is not set. Errors: no
/// cache root, [`HubError::NotCached`] saying why nothing was downloaded, [`HubError::Partial`].
pub fn resolve(id: &HubId) -> anyhow::Result<PathBuf> {
    let root = cache_root()
        .ok_or_else(|| anyhow::anyhow!("no Hugging Face cache: set HF_HUB_CACHE or HF_HOME (no home directory)"))?;
    match cached(id, &root) {
        Err(HubError::NotCached { repo, revision, looked, .. }) => {
            let why = match download(id, &root) {
                Ok(dir) => return Ok(dir),
                Err(why) => why,
            };
            Err(HubError::NotCached { repo, revision, looked, why }.into())
        }
        other => Ok(other?),
    }
}

fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .is_ok_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

/// Downloads `id`'s configs, tokenizer and safetensors weights into the cache at `root` through hf-hub's blocking
/// API, then checks the snapshot as [`cached`] does. Errors (a sentence for [`HubError::NotCached`]): offline mode,
/// an unreachable hub, a repo or file it does not serve.
fn download(id: &HubId, root: &Path) -> Result<PathBuf, String> {
    if offline() {
        return Err("HF_HUB_OFFLINE is set, so nothing was downloaded".into());
    }
    let endpoint = std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty()).unwrap_or(DEFAULT_ENDPOINT.into());
    let failed = |e: &dyn std::fmt::Display| {
        format!(
            "downloading it from {endpoint} failed ({e}); without network access, download it elsewhere (`hf download \
             {}`) into this cache, or set HF_HUB_OFFLINE=1 to skip the attempt",
            id.repo
        )
    };
    let api = hf_hub::api::sync::ApiBuilder::from_cache(Cache::new(root.to_path_buf()))
        .with_endpoint(endpoint.clone())
        .build()
        .map_err(|e| failed(&e))?;
    let repo = api.repo(id.repo());
    tracing::info!("{} is not in the cache {}: downloading it from {endpoint}", id.repo, root.display());
    let info = repo.info().map_err(|e| failed(&e))?;
    let files: Vec<&str> = info
        .siblings
        .iter()
        .map(|s| s.rfilename.as_str())
        .filter(|f| WANTED.contains(f) || (f.ends_with(".safetensors") && !f.contains('/')))
        .collect();
    if !files.contains(&"config.json") {
        return Err(format!("the hub's `{}` has no config.json: it is not a transformers checkpoint", id.repo));
    }
    for f in &files {
        repo.get(f).map_err(|e| failed(&format!("{f}: {e}")))?;
    }
    cached(id, root).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_take_org_name_and_a_revision_and_nothing_else() {
        let id = |r: &str, rev: &str| Some(HubId { repo: r.into(), revision: rev.into() });
        assert_eq!(HubId::parse("LiquidAI/LFM2-350M"), id("LiquidAI/LFM2-350M", "main"));
        assert_eq!(HubId::parse("LiquidAI/LFM2-350M@v1.0"), id("LiquidAI/LFM2-350M", "v1.0"));
        for not in ["models/a/b", "./a", "a", "/abs/path", "a/..", "a/b@", "synthetic:lfm2-8b-a1b", "a b/c"] {
            assert_eq!(HubId::parse(not), None, "{not}");
        }
    }

    #[test]
    fn a_snapshot_path_serves_under_its_repo_id() {
        let p = Path::new("/nonexistent/hub/models--LiquidAI--LFM2-350M/snapshots/0123abcd");
        assert_eq!(repo_of_path(p).as_deref(), Some("LiquidAI/LFM2-350M"));
        assert_eq!(repo_of_path(Path::new("/x/models--a--b/snapshots/c/sub")), None);
        assert_eq!(repo_of_path(Path::new("/x/lfm2-moe-f32")), None);
    }
}
