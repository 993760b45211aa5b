//! Model downloads against a local HTTP server that behaves as the Hugging Face hub does (`HEAD` with
//! `X-Linked-Etag` = the SHA-256 of an LFS file, `Range` requests): a complete snapshot needs no network, only
//! the model's files are fetched, a broken download continues where it stopped, a corrupted one is refused,
//! and two downloaders at once fetch each file once.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kazeia_engine::hub::{resolve, HubSettings, MODEL_FILES};
use kazeia_tests::hub_server::{fixture, hex, Hub, REPO, SHA};
use sha2::{Digest, Sha256};

/// A local hub, and an empty cache that downloads from it.
fn hub_with_empty_cache() -> (Hub, tempfile::TempDir, HubSettings) {
    let hub = Hub::start();
    let cache = tempfile::tempdir().unwrap();
    let settings = settings(&hub, cache.path());
    (hub, cache, settings)
}

fn settings(hub: &Hub, cache: &Path) -> HubSettings {
    HubSettings {
        endpoint: hub.endpoint.clone(),
        cache_dir: cache.to_owned(),
        offline: false,
        token: None,
    }
}

/// The error a download that must fail ends with, as text.
fn resolve_error(settings: &HubSettings) -> String {
    resolve(REPO, settings, &mut |_, _, _| {})
        .unwrap_err()
        .to_string()
}

fn snapshot_files(snapshot: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for name in MODEL_FILES {
        if snapshot.join(name).is_file() {
            found.push(name.to_owned());
        }
    }
    found
}

#[test]
fn only_the_model_files_are_fetched_and_a_complete_snapshot_needs_no_network() {
    let (hub, _cache, settings) = hub_with_empty_cache();
    let snapshot = resolve(REPO, &settings, &mut |_, _, _| {}).unwrap();
    assert_eq!(snapshot_files(&snapshot).len(), MODEL_FILES.len());
    for name in MODEL_FILES {
        assert_eq!(
            std::fs::read(snapshot.join(name)).unwrap(),
            std::fs::read(fixture().join(name)).unwrap(),
            "{name}"
        );
        assert_eq!(hub.gets(name).len(), 1, "{name} fetched once");
    }
    for extra in [
        "README.md",
        "golden.safetensors",
        "speech_tokenizer/preprocessor_config.json",
    ] {
        assert!(hub.gets(extra).is_empty(), "{extra} was fetched");
        assert!(!snapshot.join(extra).exists());
    }
    // Again: the snapshot is complete, so not one request reaches the server.
    let asked = hub.state().requests.len();
    assert_eq!(
        resolve(REPO, &settings, &mut |_, _, _| {}).unwrap(),
        snapshot
    );
    assert_eq!(
        hub.state().requests.len(),
        asked,
        "a complete snapshot made a call"
    );
}

#[test]
fn an_interrupted_download_continues_where_it_stopped() {
    let (hub, cache, settings) = hub_with_empty_cache();
    let file = "model.safetensors";
    let size = hub.state().files[file].len();
    let half = size / 2 + 123;
    hub.state().cut = Some((file.into(), half));
    let error = resolve_error(&settings);
    assert!(error.contains("continues from there"), "{error}");
    let blobs = cache.path().join("models--Kazeia--tiny/blobs");
    let partial: Vec<PathBuf> = std::fs::read_dir(&blobs)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "incomplete"))
        .collect();
    assert_eq!(partial.len(), 1, "{partial:?}");
    assert_eq!(std::fs::metadata(&partial[0]).unwrap().len() as usize, half);
    assert!(
        !cache.path().join("models--Kazeia--tiny/refs/main").exists(),
        "an incomplete snapshot was named complete"
    );

    let snapshot = resolve(REPO, &settings, &mut |_, _, _| {}).unwrap();
    assert_eq!(
        std::fs::read(snapshot.join(file)).unwrap(),
        std::fs::read(fixture().join(file)).unwrap()
    );
    // The second request asked for the rest only, and the file crossed the wire once in all.
    assert_eq!(hub.gets(file), [0, half as u64]);
    assert_eq!(hub.state().sent[file], size);
    assert!(!partial[0].exists());
}

#[test]
fn a_corrupted_download_is_refused_and_not_kept() {
    let (hub, cache, settings) = hub_with_empty_cache();
    let file = "speech_tokenizer/model.safetensors";
    hub.state().corrupt = Some(file.into());
    let error = resolve_error(&settings);
    assert!(
        error.contains("does not match the hub's checksum"),
        "{error}"
    );
    let folder = cache.path().join("models--Kazeia--tiny");
    let blobs: Vec<String> = std::fs::read_dir(folder.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    let want = hex(&Sha256::digest(&hub.state().files[file]));
    assert!(
        !blobs.iter().any(|b| b.starts_with(&want)),
        "the corrupted file was kept: {blobs:?}"
    );
    assert!(!folder.join("refs/main").exists());
    assert!(!folder.join("snapshots").join(SHA).join(file).exists());

    // Served right, it is fetched whole again and accepted.
    hub.state().corrupt = None;
    let snapshot = resolve(REPO, &settings, &mut |_, _, _| {}).unwrap();
    assert_eq!(
        std::fs::read(snapshot.join(file)).unwrap(),
        std::fs::read(fixture().join(file)).unwrap()
    );
}

#[test]
fn two_downloaders_at_once_fetch_each_file_once() {
    let hub = Hub::start();
    hub.state().pace = Duration::from_millis(5);
    let cache = tempfile::tempdir().unwrap();
    let settings = settings(&hub, cache.path());
    let waited = Arc::new(Mutex::new(0usize));
    let snapshots: Vec<PathBuf> = std::thread::scope(|scope| {
        let runs: Vec<_> = (0..2)
            .map(|_| {
                let settings = settings.clone();
                let waited = waited.clone();
                scope.spawn(move || {
                    resolve(REPO, &settings, &mut |file: &str, _, _| {
                        if file.contains("waiting") {
                            *waited.lock().unwrap() += 1;
                        }
                    })
                    .unwrap()
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert_eq!(snapshots[0], snapshots[1]);
    for name in MODEL_FILES {
        assert_eq!(hub.gets(name).len(), 1, "{name}: {:?}", hub.gets(name));
        assert_eq!(
            std::fs::read(snapshots[0].join(name)).unwrap(),
            std::fs::read(fixture().join(name)).unwrap()
        );
    }
    assert!(*waited.lock().unwrap() >= 1, "neither downloader waited");
}
