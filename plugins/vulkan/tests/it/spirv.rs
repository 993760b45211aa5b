//! The committed SPIR-V (`shaders/spv`) belongs to the GLSL sources beside it: `shaders/build.sh` records a POSIX
//! `cksum` of every source in `spv/SOURCES.cksum`, checked here without a shader compiler (CI has none); where
//! `glslangValidator` is installed, the shaders are also recompiled and compared byte for byte.

use std::path::{Path, PathBuf};
use std::process::Command;

fn shaders() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders")
}

/// POSIX `cksum`: CRC-32 (polynomial 0x04C11DB7, most significant bit first) over the bytes, then over the
/// length in as few bytes as it takes (least significant first), complemented.
fn cksum(data: &[u8]) -> u32 {
    fn update(crc: u32, byte: u8) -> u32 {
        let mut c = crc ^ ((byte as u32) << 24);
        for _ in 0..8 {
            c = if c & 0x8000_0000 != 0 {
                (c << 1) ^ 0x04C1_1DB7
            } else {
                c << 1
            };
        }
        c
    }
    let mut crc = data.iter().fold(0u32, |c, &b| update(c, b));
    let mut len = data.len();
    while len > 0 {
        crc = update(crc, (len & 0xff) as u8);
        len >>= 8;
    }
    !crc
}

#[test]
fn cksum_is_the_posix_one() {
    // `printf 'hello\n' | cksum` → 3015617425 6
    assert_eq!(cksum(b"hello\n"), 3_015_617_425);
    assert_eq!(cksum(b""), 4_294_967_295);
}

#[test]
fn every_shader_source_is_the_one_the_spirv_was_built_from() {
    let dir = shaders();
    let manifest = std::fs::read_to_string(dir.join("spv/SOURCES.cksum")).unwrap();
    let mut listed = Vec::new();
    for line in manifest.lines() {
        let mut parts = line.split_whitespace();
        let (sum, len, name) = (
            parts.next().unwrap(),
            parts.next().unwrap(),
            parts.next().unwrap(),
        );
        let source = std::fs::read(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            (cksum(&source).to_string(), source.len().to_string()),
            (sum.to_string(), len.to_string()),
            "{name} changed since the SPIR-V was built: run plugins/vulkan/shaders/build.sh"
        );
        listed.push(name.to_string());
    }
    let mut sources: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.ends_with(".comp") || n.ends_with(".glsl"))
        .collect();
    sources.sort();
    listed.sort();
    assert_eq!(
        sources, listed,
        "a source is missing from spv/SOURCES.cksum: run shaders/build.sh"
    );
}

#[test]
fn recompiling_gives_the_committed_spirv_where_a_compiler_is_installed() {
    let found = Command::new("glslangValidator")
        .arg("--version")
        .output()
        .is_ok();
    if !found {
        eprintln!("glslangValidator is not installed: the byte comparison is skipped (the checksums still ran)");
        return;
    }
    let out = std::env::temp_dir().join(format!("kazeia-spv-{}", std::process::id()));
    let status = Command::new(shaders().join("build.sh"))
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success(), "shaders/build.sh failed");
    let mut compared = 0;
    for entry in std::fs::read_dir(&out).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let committed = std::fs::read(shaders().join("spv").join(&name))
            .unwrap_or_else(|_| panic!("{name} is not committed: run shaders/build.sh"));
        assert!(
            std::fs::read(&path).unwrap() == committed,
            "spv/{name} differs from its source: run plugins/vulkan/shaders/build.sh"
        );
        compared += 1;
    }
    let committed = std::fs::read_dir(shaders().join("spv"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|x| x == "spv")
        })
        .count();
    assert_eq!(compared, committed, "stale .spv files in spv/");
    std::fs::remove_dir_all(&out).unwrap();
}
