//! What one second of audio costs each stage, in units that carry to other machines (`kazeia bench`): the
//! weight bytes the memory-bound stages read and the multiply-adds each stage does, per second of audio; the
//! rate this machine achieved; and its share of this machine's ceiling — the read rate (`bandwidth.rs`) for the
//! talker and code predictor, the f32 multiply-add rate (`fma_peak.rs`) for the decoder. `docs/board-model.md`
//! turns these into an expected real-time factor for a board from its published bandwidth and core counts.

use kazeia_engine::codec::multiply_adds::DecoderMultiplyAdds;
use kazeia_engine::codec::PROFILE_STAGES;

/// A language-model stage: per frame, the weight bytes it reads and its multiply-adds; the rate it read at and
/// the probe's rate (GB/s).
pub struct LmStage {
    pub name: String,
    pub key: String,
    pub bytes_per_frame: f64,
    pub macs_per_frame: f64,
    pub gbps: f64,
    pub probe_gbps: f64,
}

/// One row of the table, per second of audio.
struct Row {
    name: String,
    /// The row's prefix in the JSON (`talker`, `code_predictor`, `decoder_bigvgan`, …).
    key: String,
    /// MB of weights read per second of audio (none for the decoder, bound by arithmetic).
    mb: Option<f64>,
    /// 10⁹ multiply-adds per second of audio.
    gmac: f64,
    /// What this machine achieved, and its ceiling, in GB/s (LM) or 10⁹ multiply-adds/s (decoder).
    achieved: f64,
    ceiling: f64,
    unit: &'static str,
}

pub struct AudioCost {
    rows: Vec<Row>,
    fma_peak_gmacs: f64,
}

impl AudioCost {
    /// `lm`: the talker's and code predictor's rows (none for `--decoder-only`); the decoder's multiply-adds per
    /// frame and its stages' seconds over `frames` frames; `frames_per_s` of audio; the probe's multiply-add rate.
    pub fn new(
        lm: &[LmStage],
        decoder: DecoderMultiplyAdds,
        decoder_s: [f64; 5],
        frames: f64,
        frames_per_s: f64,
        fma_peak_gmacs: f64,
    ) -> Self {
        let mut rows: Vec<Row> = lm
            .iter()
            .map(|s| Row {
                name: s.name.clone(),
                key: s.key.clone(),
                mb: Some(s.bytes_per_frame * frames_per_s / 1e6),
                gmac: s.macs_per_frame * frames_per_s / 1e9,
                achieved: s.gbps,
                ceiling: s.probe_gbps,
                unit: "GB/s",
            })
            .collect();
        let macs = [
            decoder.quantizer,
            decoder.pre_conv,
            decoder.pre_transformer,
            decoder.upsample,
            decoder.bigvgan,
        ];
        for ((name, macs), s) in PROFILE_STAGES.iter().zip(macs).zip(decoder_s) {
            rows.push(Row {
                name: format!("decoder: {name}"),
                key: format!("decoder_{name}"),
                mb: None,
                gmac: macs as f64 * frames_per_s / 1e9,
                achieved: macs as f64 * frames / s / 1e9,
                ceiling: fma_peak_gmacs,
                unit: "GMAC/s",
            });
        }
        let total_s: f64 = decoder_s.iter().sum();
        rows.push(Row {
            name: "decoder total".into(),
            key: "decoder_total".into(),
            mb: None,
            gmac: decoder.total() as f64 * frames_per_s / 1e9,
            achieved: decoder.total() as f64 * frames / total_s / 1e9,
            ceiling: fma_peak_gmacs,
            unit: "GMAC/s",
        });
        AudioCost {
            rows,
            fma_peak_gmacs,
        }
    }

    pub fn print(&self, threads: usize) {
        println!(
            "per second of audio: weights read and multiply-adds (direct form: Winograd's convolutions do fewer, so \
             a decoder rate can pass the peak); ceilings: the read probe above, and {:.1} G f32 multiply-adds/s \
             ({threads} thread(s), FMA chains only)",
            self.fma_peak_gmacs
        );
        println!(
            "{:<30}{:>12}{:>12}{:>18}{:>10}",
            "stage", "MB/s audio", "GMAC/s au.", "achieved", "share"
        );
        for r in &self.rows {
            println!(
                "{:<30}{:>12}{:>12.2}{:>11.1} {:<6}{:>8.0} %",
                r.name,
                r.mb.map_or("—".into(), |mb| format!("{mb:.0}")),
                r.gmac,
                r.achieved,
                r.unit,
                r.achieved / r.ceiling * 100.0
            );
        }
    }

    /// The table's figures as JSON members (`, "…": …` each).
    pub fn json(&self) -> String {
        let mut out = format!(", \"fma_peak_gmacs\": {:.2}", self.fma_peak_gmacs);
        for r in &self.rows {
            let key = &r.key;
            if let Some(mb) = r.mb {
                out += &format!(", \"{key}_mb_per_audio_s\": {mb:.1}");
            }
            out += &format!(
                ", \"{key}_gmac_per_audio_s\": {:.3}, \"{key}_share\": {:.3}",
                r.gmac,
                r.achieved / r.ceiling
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stage's figures per second of audio are its per-frame ones at the frame rate; the decoder's rate is its
    /// multiply-adds over its time.
    #[test]
    fn rows_per_second_of_audio() {
        let lm = [LmStage {
            name: "talker".into(),
            key: "talker".into(),
            bytes_per_frame: 2e8,
            macs_per_frame: 4e8,
            gbps: 20.0,
            probe_gbps: 40.0,
        }];
        let decoder = DecoderMultiplyAdds {
            quantizer: 1_000,
            pre_conv: 2_000,
            pre_transformer: 3_000,
            upsample: 4_000,
            bigvgan: 10_000_000,
        };
        // 25 frames (2 s at 12.5 frames/s) decoded in 0.5 s in all.
        let cost = AudioCost::new(&lm, decoder, [0.1; 5], 25.0, 12.5, 100.0);
        assert_eq!(cost.rows[0].mb, Some(2500.0));
        assert_eq!(cost.rows[0].gmac, 5.0);
        let total = cost.rows.last().unwrap();
        assert_eq!(total.name, "decoder total");
        assert!((total.gmac - 10_010_000.0 * 12.5 / 1e9).abs() < 1e-12);
        assert!((total.achieved - 10_010_000.0 * 25.0 / 0.5 / 1e9).abs() < 1e-9);
        let json = cost.json();
        assert!(json.contains("\"talker_mb_per_audio_s\": 2500.0"), "{json}");
        assert!(json.contains("\"talker_share\": 0.500"), "{json}");
        assert!(
            json.contains("\"decoder_bigvgan_gmac_per_audio_s\": 0.125"),
            "{json}"
        );
        assert!(json.contains("\"decoder_total_share\""), "{json}");
    }
}
