//! Attribute values of `<prosody>` and `<break>` as multipliers and durations. A value that cannot be read
//! is `None`: the parser then leaves that property as it was (SSML processors ignore what they cannot render).

use std::time::Duration;

/// `rate`: keywords, `150%`, `+20%`/`-10%`, or a bare multiplier (`1.5`).
pub(super) fn rate(value: &str) -> Option<f32> {
    let v = value.trim();
    let keyword = match v {
        "x-slow" => Some(0.5),
        "slow" => Some(0.75),
        "medium" | "default" => Some(1.0),
        "fast" => Some(1.3),
        "x-fast" => Some(1.75),
        _ => None,
    };
    keyword
        .or_else(|| percent(v))
        .or_else(|| plain_number(v).filter(|&m| m >= 0.0))
}

/// `pitch`: keywords, percentages, semitones (`+2st`). Hertz values need the voice's base pitch, which the
/// text does not give: they are ignored.
pub(super) fn pitch(value: &str) -> Option<f32> {
    let v = value.trim();
    let keyword = match v {
        "x-low" => Some(0.75),
        "low" => Some(0.87),
        "medium" | "default" => Some(1.0),
        "high" => Some(1.15),
        "x-high" => Some(1.3),
        _ => None,
    };
    keyword.or_else(|| percent(v)).or_else(|| {
        let st = signed_number(v.strip_suffix("st")?)?;
        Some(finite(2f32.powf(st / 12.0)))
    })
}

/// `volume`: keywords, percentages, decibels (`+6dB`), or SSML 1.1's number where 100 is the default.
pub(super) fn volume(value: &str) -> Option<f32> {
    let v = value.trim();
    let keyword = match v {
        "silent" => Some(0.0),
        "x-soft" => Some(0.25),
        "soft" => Some(0.5),
        "medium" | "default" => Some(1.0),
        "loud" => Some(1.4),
        "x-loud" => Some(2.0),
        _ => None,
    };
    keyword
        .or_else(|| percent(v))
        .or_else(|| {
            let db = signed_number(v.strip_suffix("dB").or_else(|| v.strip_suffix("db"))?)?;
            Some(finite(10f32.powf(db / 20.0)))
        })
        .or_else(|| {
            // "+10" / "-5" are relative to 100, "80" is absolute: both on the 0..100 scale.
            let n = signed_number(v)?;
            let absolute = if v.starts_with(['+', '-']) {
                100.0 + n
            } else {
                n
            };
            Some((absolute / 100.0).max(0.0))
        })
}

/// An overflow (`+1000dB`) as the largest finite value: the parser multiplies and clamps, and
/// `0 × ∞` would be NaN.
fn finite(v: f32) -> f32 {
    v.min(f32::MAX)
}

/// `150%` → 1.5, `+20%` → 1.2, `-10%` → 0.9 (never below zero).
fn percent(v: &str) -> Option<f32> {
    let n = signed_number(v.strip_suffix('%')?)?;
    let m = if v.starts_with(['+', '-']) {
        1.0 + n / 100.0
    } else {
        n / 100.0
    };
    Some(m.max(0.0))
}

/// A decimal number with an optional sign, finite.
fn signed_number(v: &str) -> Option<f32> {
    let digits = v.strip_prefix(['+', '-']).unwrap_or(v);
    let n = plain_number(digits)?;
    Some(if v.starts_with('-') { -n } else { n })
}

/// An unsigned decimal number (`1`, `1.5`, `.5`), finite.
fn plain_number(v: &str) -> Option<f32> {
    let ok = !v.is_empty()
        && v.chars().all(|c| c.is_ascii_digit() || c == '.')
        && v.chars().any(|c| c.is_ascii_digit());
    ok.then(|| v.parse::<f32>().ok())
        .flatten()
        .filter(|n| n.is_finite())
}

/// `break time`: `300ms`, `1s`, `1.5s`.
pub(super) fn duration(value: &str) -> Option<Duration> {
    let v = value.trim();
    let (number, scale) = if let Some(ms) = v.strip_suffix("ms") {
        (ms, 0.001)
    } else {
        (v.strip_suffix('s')?, 1.0)
    };
    let seconds = plain_number(number.trim_end())? as f64 * scale;
    Duration::try_from_secs_f64(seconds).ok()
}

/// `break strength`.
pub(super) fn strength(value: &str) -> Option<Duration> {
    let ms = match value.trim() {
        "none" => 0,
        "x-weak" => 100,
        "weak" => 250,
        "medium" => 400,
        "strong" => 700,
        "x-strong" => 1000,
        _ => return None,
    };
    Some(Duration::from_millis(ms))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: Option<f32>, b: f32) -> bool {
        a.is_some_and(|a| (a - b).abs() < 1e-5)
    }

    #[test]
    fn rates() {
        assert!(close(rate("x-slow"), 0.5));
        assert!(close(rate("fast"), 1.3));
        assert!(close(rate("150%"), 1.5));
        assert!(close(rate("+20%"), 1.2));
        assert!(close(rate("-10%"), 0.9));
        assert!(close(rate("-200%"), 0.0));
        assert!(close(rate("0.8"), 0.8));
        for bad in [
            "", "quick", "%", "+%", "1e3", "inf", "NaN", "1.2.3x", "--5%",
        ] {
            assert_eq!(rate(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn pitches() {
        assert!(close(pitch("+12st"), 2.0));
        assert!(close(pitch("-12st"), 0.5));
        assert!(close(pitch("+2st"), 2f32.powf(2.0 / 12.0)));
        assert!(close(pitch("x-high"), 1.3));
        assert!(close(pitch("+10%"), 1.1));
        assert_eq!(pitch("200Hz"), None);
        assert_eq!(pitch("+20Hz"), None);
    }

    #[test]
    fn volumes() {
        assert!(close(volume("silent"), 0.0));
        assert!(close(volume("+6dB"), 1.995_262));
        assert!(close(volume("-6dB"), 0.501_187));
        assert!(close(volume("50%"), 0.5));
        assert!(close(volume("80"), 0.8));
        assert!(close(volume("+10"), 1.1));
        assert!(close(volume("-150"), 0.0));
        assert_eq!(volume("loudish"), None);
        assert_eq!(volume("+99999dB"), Some(f32::MAX));
        assert_eq!(pitch("+99999st"), Some(f32::MAX));
    }

    #[test]
    fn durations() {
        assert_eq!(duration("300ms"), Some(Duration::from_millis(300)));
        assert_eq!(duration("1s"), Some(Duration::from_secs(1)));
        assert_eq!(duration("1.5s"), Some(Duration::from_millis(1500)));
        assert_eq!(duration(" 20 ms"), Some(Duration::from_millis(20)));
        for bad in ["", "300", "ms", "-1s", "1e9s", "x s", "1h"] {
            assert_eq!(duration(bad), None, "{bad:?}");
        }
        assert_eq!(strength("x-strong"), Some(Duration::from_secs(1)));
        assert_eq!(strength("none"), Some(Duration::ZERO));
        assert_eq!(strength("huge"), None);
    }
}
