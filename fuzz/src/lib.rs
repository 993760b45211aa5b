//! The properties the fuzz targets check, one function per parser: each takes any bytes, must not panic, and
//! asserts what the parser promises about what it accepts. `fuzz_targets/*.rs` feed them from libFuzzer;
//! `src/bin/property_loop.rs` feeds them random and mutated inputs in a bounded loop where nightly is missing.

use std::collections::HashMap;
use std::path::Path;

use kazeia_engine::{Backend, CpuBackend, WeightFormat};

/// `Speak`'s options: any D-Bus `a{sv}` (decoded from the bytes as a message body would be) through
/// `parse_options`; what it accepts is within the documented option set.
pub fn speak_options(data: &[u8]) {
    use zbus::wire::serialized::{Context, Data};
    use zbus::wire::{Endian, OwnedVariant};
    let endian = if data.first().is_some_and(|b| b & 1 == 1) {
        Endian::Big
    } else {
        Endian::Little
    };
    let body = Data::new(data.get(1..).unwrap_or(&[]), Context::new(endian, 0));
    let Ok((options, _)) = body.deserialize::<HashMap<String, OwnedVariant>>() else {
        return;
    };
    if let Ok(parsed) = kazeiad::dbus::api::parse_options(&options) {
        let known = [
            "voice", "language", "rate", "pitch", "volume", "priority", "ssml",
        ];
        assert!(options.keys().all(|k| known.contains(&k.as_str())));
        if let Some(speaker) = &parsed.voice.speaker {
            assert!(options.contains_key("voice"), "{speaker}");
        }
    }
}

/// The Spiel stream reader: any bytes; every chunk it returns is within its size limits, and it ends (error or
/// end of stream) within one chunk per 5 input bytes.
pub fn spiel_stream(data: &[u8]) {
    use kazeia_spiel::{Chunk, SpielReader};
    let Ok(mut reader) = SpielReader::new(data) else {
        return;
    };
    let mut chunks = 0usize;
    while let Ok(Some(chunk)) = reader.next_chunk() {
        chunks += 1;
        assert!(
            chunks <= data.len() / 5 + 1,
            "more chunks than the input can hold"
        );
        match chunk {
            Chunk::Audio(bytes) => assert!(bytes.len() <= data.len()),
            Chunk::Event { name, .. } => assert!(name.len() <= data.len()),
        }
    }
}

/// The TOML configuration: any text; an accepted configuration validates, and prints back to one that parses
/// to the same values.
pub fn toml_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // What a reload reads: a file that is blank (an editor's save caught half-way) is never applied.
    if let Ok((config, _)) = kazeiad::config::parse_file(text, Path::new("fuzz.toml")) {
        assert!(!text.trim().is_empty(), "a blank file was accepted");
        assert_eq!(kazeiad::config::DaemonConfig::parse(text, "fuzz").ok(), Some(config));
    }
    if let Ok(config) = kazeiad::config::DaemonConfig::parse(text, "fuzz") {
        config.validate().expect("a parsed configuration is valid");
        let _ = config.weights_setting();
        let _ = config.sink();
    }
}

/// A stored voice file (`kazeia voice add` / `design` writes them; the daemon lists the folder): any text; an
/// accepted voice has an allowed name, the file's own.
pub fn voice_file(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(voice) = kazeiad::voice_store::parse(text, Path::new("/voices/fuzz.json")) {
        assert_eq!(voice.name, "fuzz");
        kazeiad::voice_store::check_name(&voice.name).expect("an accepted voice has an allowed name");
    }
}

/// `config.json` (the model's) and `speech_tokenizer/config.json`: any text; an accepted one has the
/// consistency its validation promises (the model's shapes the loader relies on).
pub fn model_config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let path = Path::new("config.json");
    if let Ok(config) = kazeia_engine::lm::ModelConfig::parse(text, path) {
        let t = &config.talker_config;
        assert_eq!(t.num_code_groups, t.code_predictor_config.num_code_groups);
        let _ = (config.model_type(), config.drops_instruct());
    }
    if let Ok(config) = kazeia_engine::codec::CodecConfig::parse(text, path) {
        let d = &config.decoder_config;
        assert!(d.samples_per_frame() > 0);
    }
}

/// `safetensors` header checks: any bytes; in an accepted file every tensor's bytes lie inside the data and
/// match its dtype and shape, so reading any tensor cannot fail on truncation.
pub fn safetensors_header(data: &[u8]) {
    let Ok((header_len, metadata)) = kazeia_engine::weights::check_header(data) else {
        return;
    };
    let start = 8 + header_len;
    for (name, info) in metadata.tensors() {
        let (a, b) = info.data_offsets;
        assert!(a <= b && start + b <= data.len(), "{name}: {a}..{b}");
        let elements: usize = info.shape.iter().product();
        let bits = info.dtype.bitsize();
        assert_eq!((b - a) * 8, elements * bits, "{name}");
    }
}

/// The converted-weight cache: any file bytes through the index parser, and any entry through the CPU
/// backend's import; an accepted index's entries lie inside the file, and an imported weight computes.
pub fn weight_cache(data: &[u8]) {
    if let Some(index) = kazeia_engine::weight_cache::parse_index(data, None) {
        for (name, &(start, len)) in &index {
            assert!(start + len <= data.len(), "{name}");
        }
    }
    // An entry as a backend sees it: sizes from the first bytes, the rest as the entry.
    let [o, i, f, bytes @ ..] = data else { return };
    let (out, inp) = (*o as usize % 9 + 1, (*i as usize % 5 + 1) * 32);
    let formats = [
        WeightFormat::F32,
        WeightFormat::F16,
        WeightFormat::BF16,
        WeightFormat::Q8_0,
        WeightFormat::Q4_0,
    ];
    let format = formats[*f as usize % formats.len()];
    let backend = CpuBackend::new(1);
    if let Some(w) = backend.import_linear(bytes, out, inp, format) {
        let x = vec![0.5f32; inp];
        let mut y = vec![0f32; out];
        backend.linear(&w, &x, 1, &mut y);
    }
}

/// The WAV reader (`kazeia play`): any bytes; accepted audio has a rate and at most as many samples as the
/// data holds bytes.
pub fn wav(data: &[u8]) {
    if let Ok(audio) = kazeiad::audio::wav_read::parse_wav(data) {
        assert!(audio.samples.len() <= data.len());
        assert!(audio.samples.iter().all(|s| s.is_finite() || s.is_nan()));
    }
}

/// Every property by target name.
pub const TARGETS: [(&str, fn(&[u8])); 8] = [
    ("speak_options", speak_options),
    ("spiel_stream", spiel_stream),
    ("toml_config", toml_config),
    ("model_config", model_config),
    ("safetensors_header", safetensors_header),
    ("weight_cache", weight_cache),
    ("wav", wav),
    ("voice_file", voice_file),
];

/// Valid inputs of each target to start from (what the parsers see in use), by target name.
pub fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures");
    let read = |p: &str| std::fs::read(fixtures.join(p)).unwrap_or_default();
    let mut seeds = Vec::new();

    use zbus::wire::serialized::Context;
    use zbus::wire::{Endian, Variant};
    let mut options: HashMap<&str, Variant<'_>> = HashMap::new();
    options.insert("voice", Variant::from("ryan"));
    options.insert("language", Variant::from("english"));
    options.insert("rate", Variant::from(1.5f64));
    options.insert("pitch", Variant::from(1u32));
    options.insert("priority", Variant::from("message"));
    options.insert("ssml", Variant::from(true));
    for (tag, endian) in [(0u8, Endian::Little), (1, Endian::Big)] {
        if let Ok(body) = zbus::wire::to_bytes(Context::new(endian, 0), &options) {
            let mut seed = vec![tag];
            seed.extend_from_slice(&body);
            seeds.push(("speak_options", seed));
        }
    }

    let mut writer = kazeia_spiel::SpielWriter::new(Vec::new()).expect("in memory");
    let _ = writer.audio(&[0.0, 0.5, -0.5, 1.0]);
    let _ = writer.event(kazeia_spiel::EventKind::Mark, 3, 7, "here");
    let _ = writer.audio(&[0.25; 8]);
    seeds.push(("spiel_stream", writer.into_inner()));

    let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/kazeia.toml");
    seeds.push(("toml_config", std::fs::read(config).unwrap_or_default()));
    let voice = kazeiad::voice_store::StoredVoice::designed("fuzz", "A calm, low voice.", "english");
    seeds.push((
        "voice_file",
        serde_json::to_vec(&voice).expect("a voice encodes"),
    ));
    seeds.push(("model_config", read("lm/shape_0b6/config.json")));
    seeds.push((
        "model_config",
        read("lm/shape_0b6/speech_tokenizer/config.json"),
    ));

    // A small safetensors file: the golden tensors of a fixture are a few kB.
    seeds.push((
        "safetensors_header",
        read("lm/shape_0b6/golden.safetensors"),
    ));

    // A cache file with two entries, and a CPU backend's exported Q8_0 and F32 layers.
    let backend = CpuBackend::new(1);
    let w: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
    for (format, tag) in [(WeightFormat::Q8_0, 3u8), (WeightFormat::F32, 0)] {
        let weight = backend.upload_linear(&w, 2, 32, None, format);
        if let Some(bytes) = backend.export_linear(&weight) {
            let mut seed = vec![1, 0, tag];
            seed.extend_from_slice(&bytes);
            seeds.push(("weight_cache", seed));
        }
    }
    if let Ok(dir) = std::env::temp_dir()
        .join(format!("kazeia-fuzz-seed-{}", std::process::id()))
        .canonicalize()
        .or_else(|_| {
            let d = std::env::temp_dir().join(format!("kazeia-fuzz-seed-{}", std::process::id()));
            std::fs::create_dir_all(&d).map(|()| d)
        })
    {
        let checkpoint = dir.join("model.safetensors");
        let _ = std::fs::write(&checkpoint, b"x");
        let cache = kazeia_engine::weight_cache::WeightCache::open_in(&dir, &checkpoint, "seed");
        cache.put("a.weight", vec![1, 2, 3, 4]);
        cache.put("b.weight", vec![9; 40]);
        if cache.save().is_ok() {
            if let Some(bytes) = cache.path().and_then(|p| std::fs::read(p).ok()) {
                seeds.push(("weight_cache", bytes));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    // WAV files of the formats `kazeia play` reads.
    for (tag, bits, channels) in [(1u16, 16u16, 1u16), (1, 24, 2), (3, 32, 1), (1, 8, 1)] {
        let data: Vec<u8> = (0..32u8).collect();
        let mut wav = b"RIFF".to_vec();
        wav.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
        wav.extend_from_slice(b"WAVEfmt ");
        wav.extend_from_slice(&16u32.to_le_bytes());
        wav.extend_from_slice(&tag.to_le_bytes());
        wav.extend_from_slice(&channels.to_le_bytes());
        wav.extend_from_slice(&24000u32.to_le_bytes());
        let block = channels * bits / 8;
        wav.extend_from_slice(&(24000 * block as u32).to_le_bytes());
        wav.extend_from_slice(&block.to_le_bytes());
        wav.extend_from_slice(&bits.to_le_bytes());
        wav.extend_from_slice(b"data");
        wav.extend_from_slice(&(data.len() as u32).to_le_bytes());
        wav.extend_from_slice(&data);
        seeds.push(("wav", wav));
    }
    seeds
}
