use super::*;

fn text(t: &str) -> Piece {
    Piece::Text {
        text: t.into(),
        prosody: Prosody::NEUTRAL,
    }
}

fn with(t: &str, rate: f32, pitch: f32, volume: f32) -> Piece {
    Piece::Text {
        text: t.into(),
        prosody: Prosody {
            rate,
            pitch,
            volume,
        },
    }
}

fn mark(m: &str) -> Piece {
    Piece::Mark(m.into())
}

fn ms(n: u64) -> Piece {
    Piece::Break(Duration::from_millis(n))
}

fn parse(s: &str) -> Vec<Piece> {
    parse_ssml(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
}

/// Asserts that `ssml` parses to one piece of text at the neutral prosody, `said`.
fn assert_says(ssml: &str, said: &str) {
    assert_eq!(parse(ssml), vec![text(said)], "{ssml}");
}

fn error(s: &str) -> SsmlError {
    match parse_ssml(s) {
        Ok(p) => panic!("{s:?} accepted as {p:?}"),
        Err(e) => e,
    }
}

/// Prosody compared to 1e-5, text exactly.
fn assert_pieces(got: &[Piece], want: &[Piece]) {
    assert_eq!(got.len(), want.len(), "{got:?}\nvs {want:?}");
    for (g, w) in got.iter().zip(want) {
        match (g, w) {
            (
                Piece::Text {
                    text: gt,
                    prosody: gp,
                },
                Piece::Text {
                    text: wt,
                    prosody: wp,
                },
            ) => {
                assert_eq!(gt, wt);
                for (a, b) in [
                    (gp.rate, wp.rate),
                    (gp.pitch, wp.pitch),
                    (gp.volume, wp.volume),
                ] {
                    assert!((a - b).abs() < 1e-5, "{gp:?} vs {wp:?} for {gt:?}");
                }
            }
            _ => assert_eq!(g, w),
        }
    }
}

#[test]
fn speech_dispatcher_message_with_sentence_marks() {
    // Verbatim what speech-dispatcher 0.11.4 sent a module for `spd-say "One. Two & <three>? Four!"`.
    let got = parse(
        "<speak>One.<mark name=\"__spd_0\"/> Two &amp; &lt;three&gt;?<mark name=\"__spd_1\"/> Four!</speak>",
    );
    assert_eq!(
        got,
        vec![
            text("One."),
            mark("__spd_0"),
            text("Two & <three>?"),
            mark("__spd_1"),
            text("Four!")
        ]
    );
}

#[test]
fn speech_dispatcher_plain_and_ssml_mode_messages() {
    assert_says(
        "<speak>Hello world from the speech dispatcher test</speak>",
        "Hello world from the speech dispatcher test",
    );
    assert_eq!(
        parse("<speak>Hi <mark name=\"m1\"/> there</speak>"),
        vec![text("Hi"), mark("m1"), text("there")]
    );
    // A multi-line message as the module protocol delivers it (lines joined with LF).
    assert_eq!(
        parse("<speak>First line.<mark name=\"__spd_0\"/>\nSecond   line.</speak>"),
        vec![text("First line."), mark("__spd_0"), text("Second line.")]
    );
}

#[test]
fn root_is_optional_and_unknown_elements_keep_their_text() {
    assert_says("plain text", "plain text");
    assert_eq!(parse("  "), vec![]);
    assert_eq!(parse(""), vec![]);
    assert_eq!(
        parse(
            "<?xml version=\"1.0\"?><speak version=\"1.1\" xmlns=\"http://www.w3.org/2001/10/synthesis\" \
             xml:lang=\"en-US\"><voice name=\"x\"><p><s>One</s><s>two</s></p><emphasis level=\"strong\">th</emphasis>ree \
             <lang xml:lang=\"fr\">quatre</lang><!-- not said --> <phoneme ph=\"x\">five</phoneme></voice></speak>"
        ),
        vec![text("One two three quatre five")]
    );
    assert_eq!(
        parse("a <ssml:mark name=\"n\"/>b"),
        vec![text("a"), mark("n"), text("b")]
    );
    assert_says(
        "<audio src=\"x.wav\"><desc>a bell</desc>ding</audio>",
        "ding",
    );
}

#[test]
fn breaks() {
    assert_eq!(
        parse("a<break time=\"300ms\"/>b<break time=\"1s\"/>c<break/>d<break strength=\"x-strong\"/>e"),
        vec![
            text("a"),
            ms(300),
            text("b"),
            ms(1000),
            text("c"),
            ms(400),
            text("d"),
            ms(1000),
            text("e")
        ]
    );
    // strength="none" is no boundary; time wins over strength; adjacent breaks add up to the cap.
    assert_says("a<break strength=\"none\"/> b", "a b");
    assert_eq!(
        parse("a<break time=\"20ms\" strength=\"strong\"></break>b"),
        vec![text("a"), ms(20), text("b")]
    );
    assert_eq!(
        parse("a<break time=\"1h\"/><break time=\"99999s\"/>"),
        vec![text("a"), ms(10_000)]
    );
    assert_eq!(
        parse("<break time=\"8s\"/><break time=\"8s\"/>"),
        vec![Piece::Break(MAX_BREAK)]
    );
}

#[test]
fn prosody_values_and_nesting() {
    let got = parse(
        "<speak>n<prosody rate=\"150%\" pitch=\"+2st\" volume=\"+6dB\">a<prosody rate=\"-10%\" volume=\"x-soft\">b</prosody>\
         c</prosody><prosody rate=\"x-fast\" pitch=\"x-low\" volume=\"silent\">d</prosody>\
         <prosody rate=\"quick\" pitch=\"120Hz\">e</prosody></speak>",
    );
    let st2 = 2f32.powf(2.0 / 12.0);
    let db6 = 10f32.powf(6.0 / 20.0);
    assert_pieces(
        &got,
        &[
            text("n"),
            with("a", 1.5, st2, db6),
            with("b", 1.35, st2, db6 * 0.25),
            with("c", 1.5, st2, db6),
            with("d", 1.75, 0.75, 0.0),
            text("e"),
        ],
    );
    // Nesting multiplies up to a clamp.
    let deep = "<prosody rate=\"x-fast\">".repeat(10) + "z" + &"</prosody>".repeat(10);
    assert_pieces(&parse(&deep), &[with("z", 10.0, 1.0, 1.0)]);
}

#[test]
fn adjacent_text_merges_across_neutral_elements() {
    assert_says(
        "a <prosody rate=\"fast\"> </prosody> b<emphasis>c</emphasis>",
        "a bc",
    );
    assert_says("a<prosody rate=\"100%\">b</prosody>c", "abc");
}

#[test]
fn say_as_characters_and_sub() {
    assert_says(
        "Type <say-as interpret-as=\"characters\">ls -la</say-as> now",
        "Type L S dash L A now",
    );
    assert_says(
        "<say-as interpret-as=\"spell-out\">Kz9</say-as><say-as interpret-as=\"date\">1/2</say-as>",
        "K Z 9 1/2",
    );
    assert_says(
        "<sub alias=\"World Wide Web\">WWW</sub> and <sub>keep</sub>",
        "World Wide Web and keep",
    );
    assert_says(
        "<say-as interpret-as=\"characters\"><sub alias=\"ab\">x</sub></say-as>",
        "A B",
    );
}

#[test]
fn plain_text_is_one_piece() {
    assert_eq!(plain_text("  a <b> & c \n"), vec![text("a <b> & c")]);
    assert_eq!(plain_text(" \n "), vec![]);
}

#[test]
fn malformed_input_is_an_error_with_its_position() {
    let e = error("<speak>a</p></speak>");
    assert_eq!((e.line, e.column), (1, 9));
    assert!(e.message.contains("</p> does not close <speak>"), "{e}");

    let e = error("<speak>\n<prosody rate=\"fast\">a\n</speak>");
    assert_eq!((e.line, e.column), (3, 1));

    let e = error("<speak>a");
    assert_eq!((e.line, e.column, e.offset), (1, 1, 0));
    assert_eq!(
        e.to_string(),
        "invalid SSML at line 1, column 1: <speak> is never closed"
    );

    let e = error("a</speak>");
    assert!(e.message.contains("without a matching start tag"), "{e}");

    for bad in [
        "<mark/>",
        "<mark name=\"\"/>",
        "<mark name=\" \"/>",
        "<mark nam=\"x\"/>",
        "a &foo; b",
        "a & b",
        "<speak a=b>x</speak>",
        "<speak a=\"b\"c=\"d\">x</speak>",
        "<break time=300ms/>",
        "x < y",
        "<Speak>x</speak>",
    ] {
        let e = error(bad);
        assert!(!e.message.is_empty(), "{bad:?}");
    }
}

#[test]
fn nesting_depth_is_limited() {
    let ok = "<s>".repeat(MAX_DEPTH) + "x" + &"</s>".repeat(MAX_DEPTH);
    assert_says(&ok, "x");
    let deep = "<s>".repeat(MAX_DEPTH + 1) + "x" + &"</s>".repeat(MAX_DEPTH + 1);
    let e = error(&deep);
    assert_eq!(e.offset, 3 * MAX_DEPTH);
    // Empty elements do not nest: any number of them is fine.
    assert_eq!(parse(&"<emphasis/>".repeat(10_000)), vec![]);
}

#[test]
fn non_ascii_text_and_marks() {
    assert_eq!(
        parse("<speak>日本語。<mark name=\"é\"/>Ça va&#x3F;</speak>"),
        vec![text("日本語。"), mark("é"), text("Ça va?")]
    );
}

/// A fixed-seed xorshift, so the mutation test is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Thousands of mutated messages: the parser never panics, and what it returns keeps its promises.
#[test]
fn mutated_inputs_never_panic_and_keep_invariants() {
    let seeds = [
        "<speak>One.<mark name=\"__spd_0\"/> Two &amp; &lt;three&gt;?<mark name=\"__spd_1\"/> Four!</speak>",
        "<speak><prosody rate=\"+20%\" pitch=\"+2st\" volume=\"-6dB\">a<break time=\"300ms\"/>b</prosody></speak>",
        "<say-as interpret-as=\"characters\">abc</say-as><sub alias=\"x\">y</sub><![CDATA[<]]><!--c-->",
    ];
    let pieces = [
        "<", ">", "/", "&", ";", "=", "\"", "'", " ", "mark", "break", "prosody", "speak", "#x41",
        "amp", "é", "\n", "</s>", "<s>", "st", "%", "ms", "-",
    ];
    let mut rng = Rng(0x5eed_0f55_3a11);
    let (mut ok, mut failed) = (0, 0);
    for _ in 0..5000 {
        let mut s = seeds[rng.below(seeds.len())].to_string();
        for _ in 0..1 + rng.below(4) {
            let mut at = rng.below(s.len() + 1);
            while !s.is_char_boundary(at) {
                at -= 1;
            }
            match rng.below(3) {
                0 => s.insert_str(at, pieces[rng.below(pieces.len())]),
                1 => {
                    let mut end = (at + 1 + rng.below(8)).min(s.len());
                    while !s.is_char_boundary(end) {
                        end += 1;
                    }
                    s.replace_range(at..end, "");
                }
                _ => {
                    let copy = s[at..].chars().take(rng.below(12)).collect::<String>();
                    s.insert_str(at, &copy);
                }
            }
        }
        match parse_ssml(&s) {
            Ok(pieces) => {
                ok += 1;
                for p in pieces {
                    match p {
                        Piece::Text { text, prosody } => {
                            assert!(!text.is_empty() && text.trim() == text, "{s:?}");
                            assert!(!text.contains("  "), "{s:?}");
                            assert!((0.1..=10.0).contains(&prosody.rate), "{s:?}");
                            assert!((0.25..=4.0).contains(&prosody.pitch), "{s:?}");
                            assert!((0.0..=4.0).contains(&prosody.volume), "{s:?}");
                        }
                        Piece::Mark(name) => assert!(!name.trim().is_empty(), "{s:?}"),
                        Piece::Break(d) => assert!(!d.is_zero() && d <= MAX_BREAK, "{s:?}"),
                    }
                }
            }
            Err(e) => {
                failed += 1;
                assert!(e.offset <= s.len() && e.line >= 1 && e.column >= 1, "{s:?}");
            }
        }
    }
    // Both paths were exercised.
    assert!(ok > 500 && failed > 500, "{ok} parsed, {failed} rejected");
}

#[test]
fn silence_stays_silent_whatever_gain_is_nested_in_it() {
    // 0 × ∞ was NaN, which synthesis took as the voice's own volume.
    for ssml in [
        "<prosody volume=\"silent\"><prosody volume=\"+99999dB\">x</prosody></prosody>",
        "<prosody volume=\"+99999dB\"><prosody volume=\"silent\">x</prosody></prosody>",
        "<prosody volume=\"0\"><prosody volume=\"+3.4e38\">x</prosody></prosody>",
    ] {
        assert_pieces(&parse(ssml), &[with("x", 1.0, 1.0, 0.0)]);
    }
    let huge = "<prosody volume=\"+99999dB\" pitch=\"+99999st\">x</prosody>";
    assert_pieces(&parse(huge), &[with("x", 1.0, 4.0, 4.0)]);
}

#[test]
fn the_pauses_of_an_utterance_are_capped_in_total() {
    // 20,000 breaks of 10 s (under 1 MiB) asked for 55 hours of silence.
    let bomb = "<break time=\"10s\"/><mark name=\"m\"/>".repeat(20_000);
    assert!(bomb.len() < 1 << 20);
    let pieces = parse(&bomb);
    let total: Duration = pieces
        .iter()
        .map(|p| match p {
            Piece::Break(d) => *d,
            _ => Duration::ZERO,
        })
        .sum();
    assert_eq!(total, MAX_TOTAL_BREAK);
    assert_eq!(pieces.iter().filter(|p| **p == mark("m")).count(), 20_000);
    // Past the budget a break still parts the words around it.
    let text_after = "<break time=\"10s\"/>x ".repeat(6) + "a<break/>b";
    let pieces = parse(&text_after);
    assert_eq!(pieces.last(), Some(&text("x a b")), "{pieces:?}");
    // The last pause fills the budget exactly.
    let pieces = parse(&("<break time=\"7s\"/>x".repeat(10)));
    assert_eq!(pieces.len(), 18, "{pieces:?}");
    assert_eq!(pieces[16], ms(4000));
    assert_eq!(pieces[17], text("x x"));
}

#[test]
fn spelling_out_is_bounded_and_the_rest_is_read_as_written() {
    let long = "!".repeat(MAX_SPELLED_CHARS) + "abc";
    let pieces = parse(&format!(
        "<say-as interpret-as=\"characters\">{long}</say-as>"
    ));
    let [Piece::Text { text, .. }] = pieces.as_slice() else {
        panic!("{pieces:?}")
    };
    assert_eq!(text.matches("exclamation mark").count(), MAX_SPELLED_CHARS);
    assert!(
        text.ends_with("exclamation mark abc"),
        "{}",
        &text[text.len() - 40..]
    );
    // The budget is per utterance, not per element.
    let many = "<say-as interpret-as=\"characters\">ab</say-as>".repeat(MAX_SPELLED_CHARS);
    let pieces = parse(&many);
    let [Piece::Text { text, .. }] = pieces.as_slice() else {
        panic!("{pieces:?}")
    };
    assert_eq!(
        text.matches('A').count() + text.matches('B').count(),
        MAX_SPELLED_CHARS
    );
}

/// CPU time of this thread (not wall-clock: other processes on the machine do not count).
fn thread_cpu_time() -> Duration {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write to.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// The least CPU time of a few parses (the least is the one least disturbed).
fn parse_cost(input: &str) -> Duration {
    (0..5)
        .map(|_| {
            let start = thread_cpu_time();
            let _ = std::hint::black_box(parse_ssml(std::hint::black_box(input)));
            thread_cpu_time() - start
        })
        .min()
        .unwrap()
}

/// Adversarial inputs 16 times longer cost about 16 times more, never the 256 times a quadratic
/// parser would: the bound (64) is so far from both that no machine noise can cross it.
#[test]
fn parsing_is_linear_in_the_input() {
    type Shape = (&'static str, fn(usize) -> String);
    let shapes: [Shape; 10] = [
        ("sentence tags (blank text pending)", |n| "<s/>".repeat(n)),
        ("attributes of one tag", |n| {
            let attrs: String = (0..n).map(|i| format!(" a{i}='v'")).collect();
            format!("<x{attrs}/>")
        }),
        ("declarations", |n| "<!x>".repeat(n) + "y"),
        ("comments", |n| "<!--x-->".repeat(n)),
        ("prosody changes", |n| {
            "<prosody volume=\"50%\">a</prosody>b".repeat(n)
        }),
        ("spelled runs", |n| {
            "<say-as interpret-as=\"characters\">ab</say-as>".repeat(n)
        }),
        ("marks", |n| "<mark name=\"m\"/>w ".repeat(n)),
        ("breaks", |n| "<break time=\"1ms\"/>".repeat(n)),
        ("entities", |n| "&amp;&#x41;".repeat(n)),
        ("words", |n| "word ".repeat(n)),
    ];
    for (what, make) in shapes {
        // ~16 KB, then ~256 KB.
        let unit = make(1).len();
        let small = make(16_384 / unit + 1);
        let large = make(16 * (16_384 / unit + 1));
        let ratio = parse_cost(&large).as_secs_f64() / parse_cost(&small).as_secs_f64().max(1e-9);
        eprintln!("{what}: 16 times the input, {ratio:.1} times the CPU time");
        assert!(
            ratio < 64.0,
            "{what}: 16 times the input cost {ratio:.0} times the CPU time"
        );
    }
}
