//! `kazeia bench` on a tiny fixture model: the JSON it prints for tools, and its bandwidth rows consistent
//! (each share is its row's rate over the probe paired with it).

use std::path::Path;
use std::process::Command;

use crate::assert_ok;

/// `kazeia bench --model <the tiny 0.6B-shaped fixture> ARGS --json`: the JSON line it prints.
fn bench_json(args: &[&str]) -> serde_json::Value {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/lm/shape_0b6");
    let output = Command::new(env!("CARGO_BIN_EXE_kazeia"))
        .args(["bench", "--model"])
        .arg(&model)
        .args(args)
        .arg("--json")
        .output()
        .expect("cannot run kazeia");
    assert_ok(&output);
    let stdout = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(stdout.lines().last().expect("a JSON line")).expect("JSON")
}

#[test]
fn bench_prints_every_stage_and_paired_bandwidth_shares() {
    let json = bench_json(&["--frames", "4", "--repeat", "3"]);
    let number = |key: &str| {
        json[key]
            .as_f64()
            .unwrap_or_else(|| panic!("no number `{key}` in {json}"))
    };
    for key in [
        "talker_ms_per_frame",
        "cp_ms_per_frame",
        "decoder_ms",
        "rtf",
    ] {
        assert!(number(key) > 0.0, "{key} = {}", number(key));
    }
    for stage in ["talker", "cp"] {
        let (gbps, probe, share) = (
            number(&format!("{stage}_gbps")),
            number(&format!("{stage}_probe_gbps")),
            number(&format!("{stage}_bandwidth_share")),
        );
        assert!(
            gbps > 0.0 && probe > 0.0,
            "{stage}: {gbps} GB/s, probe {probe}"
        );
        // The JSON rounds to 2 and 3 decimals.
        assert!(
            (gbps / probe - share).abs() < 2e-3 + 0.01 * share,
            "{stage}: {gbps} / {probe} is not the share {share}"
        );
    }
    // What a second of audio costs: the LM stages' bytes are their bytes per frame at the codec's frame rate
    // (this fixture's 2 ms frames: 500 a second), every stage has multiply-adds and a share of its ceiling, and
    // the decoder's stages add up to its total.
    assert!(number("fma_peak_gmacs") > 0.0);
    let frames_per_s = number("frames") / number("audio_s");
    let frame_mb = number("talker_weight_mb_per_frame");
    let audio_mb = number("talker_mb_per_audio_s");
    // The JSON rounds MB per frame to 2 decimals.
    assert!(
        (audio_mb - frames_per_s * frame_mb).abs() <= 0.005 * frames_per_s + 0.1,
        "{audio_mb} MB per s of audio from {frame_mb} MB per frame at {frames_per_s} frames/s"
    );
    let stages = [
        "quantizer",
        "pre_conv",
        "pre_transformer",
        "upsample",
        "bigvgan",
    ];
    let mut sum = 0.0;
    for stage in ["talker", "code_predictor"]
        .into_iter()
        .map(String::from)
        .chain(stages.iter().map(|s| format!("decoder_{s}")))
        .chain(["decoder_total".to_string()])
    {
        let (gmac, share) = (
            number(&format!("{stage}_gmac_per_audio_s")),
            number(&format!("{stage}_share")),
        );
        assert!(
            gmac > 0.0 && share > 0.0,
            "{stage}: {gmac} G, share {share}"
        );
        if stage.starts_with("decoder_") && stage != "decoder_total" {
            sum += gmac;
        }
    }
    // The least hold for no gap (none if the first delivery can play at once), started no earlier than the
    // first arrival; the daemon's plan for the last session leaves no gap when it held at least that.
    let (hold, delay) = (number("no_gap_hold_ms"), number("no_gap_delay_ms"));
    assert!(
        hold >= 0.0 && delay >= 0.0 && (hold > 0.0) == (delay > 0.0),
        "hold {hold} ms, delay {delay} ms"
    );
    // The daemon's plan for the last session (its logic has unit tests in `bench.rs` and `plan.rs`).
    let planned = [
        "planned_hold_ms",
        "planned_first_audio_ms",
        "planned_silence_ms",
    ]
    .map(number);
    assert!(
        planned.iter().all(|v| v.is_finite() && *v >= 0.0) && planned[1] > 0.0,
        "{planned:?}"
    );
    let total = number("decoder_total_gmac_per_audio_s");
    assert!(
        (sum - total).abs() < 0.01 + 1e-3 * total,
        "{sum} vs {total}"
    );
}

/// `kazeia bench --batch` on the same model: every width's row, and the ceiling the unbatched decoder sets,
/// which no width's ratio passes (a width's compute includes at least the decoder's).
#[test]
fn bench_batch_prints_each_width_under_the_decoder_ceiling() {
    let json = bench_json(&["--frames", "4", "--repeat", "1", "--batch", "1,4"]);
    let ceiling = json["ratio_ceiling"].as_f64().expect("a ceiling");
    let runs = json["runs"].as_array().expect("runs");
    let modes: Vec<&str> = runs.iter().map(|r| r["mode"].as_str().unwrap()).collect();
    assert_eq!(modes, ["sequential", "batch 1", "batch 4"]);
    assert!(ceiling > 1.0 && ceiling.is_finite(), "ceiling {ceiling}");
    for run in runs {
        let ratio = run["ratio"].as_f64().expect("a ratio");
        assert!(
            ratio > 0.0 && ratio <= ceiling,
            "{}: ratio {ratio} past the ceiling {ceiling}",
            run["mode"]
        );
    }
}
