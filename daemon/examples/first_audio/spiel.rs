//! `spiel`: Spiel `Synthesize` → first audio on the client's pipe.

use std::time::Instant;

use kazeia_spiel::{Chunk, SpielReader};

use crate::common::{connect_in_this_process, spiel_proxy};

/// Time to first audio through the daemon (`bench_daemon`) for a sentence, a letter (twice: the second from
/// the cache of short utterances) and a word, then where each utterance's time went as the daemon logged it.
pub async fn first_audio() {
    let (_dir, bus, daemon) = crate::bench_daemon("daemon-bench");
    let connection = connect_in_this_process(&bus).await;
    for (what, text) in [
        ("sentence", "The quick brown fox jumps over the lazy dog."),
        ("letter", "k"),
        ("letter again (cached)", "k"),
        ("word", "Enter"),
    ] {
        let (reader, writer) = std::io::pipe().unwrap();
        let fd: std::os::fd::OwnedFd = writer.into();
        let proxy = spiel_proxy(&connection).await;
        let start = Instant::now();
        let read = std::thread::spawn(move || {
            let mut stream = SpielReader::new(reader).unwrap();
            let mut first = None;
            let mut samples = 0;
            while let Some(chunk) = stream.next_chunk().unwrap() {
                if let Chunk::Audio(pcm) = chunk {
                    first.get_or_insert_with(|| start.elapsed());
                    samples += pcm.len() / 2;
                }
            }
            (first, samples, start.elapsed())
        });
        proxy
            .call::<_, _, ()>(
                "Synthesize",
                &(zbus::Fd::from(&fd), text, "", 1.0f64, 1.0f64, false, ""),
            )
            .await
            .unwrap();
        drop(fd);
        let (first, samples, total) = tokio::task::spawn_blocking(move || read.join().unwrap())
            .await
            .unwrap();
        println!(
            "{what}: first audio after {:.1} ms, {:.2} s of audio in {:.2} s",
            first.unwrap().as_secs_f64() * 1e3,
            samples as f64 / 24000.0,
            total.as_secs_f64()
        );
    }
    // Where each utterance's time went, as the daemon logged it.
    for line in daemon.log().lines().filter(|l| l.contains("utterance")) {
        println!(
            "  {}",
            line.split("utterance").nth(1).unwrap_or(line).trim()
        );
    }
}
