//! Batched generation (`lm::generate_batch`) against one prompt at a time: on the committed tiny fixtures, the
//! greedy codes of every prompt generated in a batch (width 2, 3 and 4, prompts of different lengths, layouts
//! and voices, so sequences end at different frames and later ones join mid-way) are identical to
//! `generate`'s on that prompt alone, and to the official goldens; the frames each sequence hands to its
//! callback are its codes, in order.

use crate::common;

use std::cell::RefCell;
use std::sync::Arc;

use common::lm_fixtures::{fixture, golden_codes, max_new_tokens, model_as, request, runs, CASES};

use kazeia_engine::lm::{
    generate, generate_batch, BatchOptions, BatchSequence, GenerateOptions, Prompt, TtsModel,
};
use kazeia_engine::{CpuBackend, WeightFormat};

/// A golden run's name, `max_new_tokens` and codes.
type Golden = (String, usize, Vec<Vec<u32>>);

/// Every run's prompt and its golden codes, with the greedy options (one `max_new_tokens` for all: the
/// largest of the runs).
fn prompts(model: &TtsModel, case: &str) -> (Vec<Prompt>, Vec<Golden>) {
    let runs = runs(case);
    let prompts = runs
        .iter()
        .map(|run| model.prompt(&request(run)).unwrap())
        .collect();
    let goldens = runs
        .iter()
        .map(|run| {
            (
                run["name"].as_str().unwrap().to_owned(),
                max_new_tokens(run),
                golden_codes(run),
            )
        })
        .collect();
    (prompts, goldens)
}

fn unbatched(
    model: &TtsModel,
    prompts: &[Prompt],
    options: &GenerateOptions,
) -> Vec<Vec<Vec<u32>>> {
    prompts
        .iter()
        .map(|p| {
            generate(
                model,
                p,
                options,
                &mut || unreachable!("greedy"),
                &mut |_| true,
            )
            .unwrap()
            .codes
        })
        .collect()
}

/// `generate_batch` of `prompts`; also checks that each sequence's callbacks saw exactly its codes, in order.
fn batched(
    model: &TtsModel,
    prompts: &[Prompt],
    options: &GenerateOptions,
    batch: BatchOptions,
) -> Vec<Vec<Vec<u32>>> {
    let seen: Vec<RefCell<Vec<Vec<u32>>>> = prompts.iter().map(|_| RefCell::default()).collect();
    let ended: Vec<RefCell<Option<Vec<Vec<u32>>>>> =
        prompts.iter().map(|_| RefCell::default()).collect();
    let mut sequences = prompts.iter().enumerate().map(|(i, prompt)| {
        let (seen, ended) = (&seen[i], &ended[i]);
        Ok(
            BatchSequence::new(prompt.clone(), || unreachable!("greedy"))
                .on_frame(move |f| {
                    assert!(ended.borrow().is_none(), "a frame after the end");
                    seen.borrow_mut().push(f.to_vec());
                    true
                })
                .on_end(move |g| *ended.borrow_mut() = Some(g.codes.clone())),
        )
    });
    let out = generate_batch(model, &mut sequences, options, batch).unwrap();
    drop(sequences);
    assert_eq!(out.sequences.len(), prompts.len());
    assert_eq!(
        out.rows,
        out.sequences.iter().map(|g| g.codes.len()).sum::<usize>(),
        "one code-predictor row per frame"
    );
    if batch.width > 1 {
        assert!(out.steps < out.rows, "sequences shared steps");
    }
    let codes: Vec<Vec<Vec<u32>>> = out.sequences.into_iter().map(|g| g.codes).collect();
    for (i, c) in codes.iter().enumerate() {
        assert_eq!(&*seen[i].borrow(), c, "frames handed out are the codes");
        assert_eq!(
            ended[i].borrow().as_ref(),
            Some(c),
            "ended once with its codes"
        );
    }
    codes
}

#[test]
fn batched_greedy_codes_are_those_of_one_prompt_at_a_time_and_official() {
    for case in CASES {
        let model = TtsModel::load(&fixture(case), Arc::new(CpuBackend::new(1))).unwrap();
        let (prompts, goldens) = prompts(&model, case);
        let mut options = model.default_options(true);
        options.max_new_tokens = goldens.iter().map(|g| g.1).max().unwrap();
        let alone = unbatched(&model, &prompts, &options);
        // Each against the official run: identical where it ended by EOS, the official frames a prefix where
        // the official run stopped at its own (smaller) `max_new_tokens`.
        for ((name, max, golden), ours) in goldens.iter().zip(&alone) {
            if golden.len() + 1 < *max {
                assert_eq!(
                    ours, golden,
                    "{case}/{name}: unbatched codes differ from official"
                );
            } else {
                assert_eq!(&ours[..golden.len()], &golden[..], "{case}/{name}");
            }
        }
        let lengths: Vec<usize> = alone.iter().map(Vec::len).collect();
        assert!(
            lengths.iter().any(|&l| l != lengths[0]),
            "{case}: sequences end at different frames"
        );
        for width in [2, 3, 4] {
            for lead_frames in [0, 1, 3] {
                let codes = batched(
                    &model,
                    &prompts,
                    &options,
                    BatchOptions { width, lead_frames },
                );
                for (i, (ours, theirs)) in codes.iter().zip(&alone).enumerate() {
                    assert_eq!(
                        ours, theirs,
                        "{case}/{}: width {width}, lead {lead_frames}: batched codes differ",
                        goldens[i].0
                    );
                }
            }
        }
    }
}

/// The same on the lossy formats (the integer kernels of the CPU backend), with two threads (the linear
/// layers' output columns split across them): a row's result does not depend on the other rows.
#[test]
fn batched_codes_are_unbatched_ones_under_lossy_formats_and_threads() {
    for case in CASES {
        for format in [WeightFormat::Q8_0, WeightFormat::Q4_0, WeightFormat::BF16] {
            let model = model_as(case, format, 2);
            let (prompts, _) = prompts(&model, case);
            let mut options = model.default_options(true);
            options.max_new_tokens = 40;
            let alone = unbatched(&model, &prompts, &options);
            let codes = batched(&model, &prompts, &options, BatchOptions::default());
            assert_eq!(codes, alone, "{case} {format}");
        }
    }
}

/// A sequence whose callback says stop leaves the batch; the others are unchanged.
#[test]
fn a_stopped_sequence_leaves_the_others_unchanged() {
    let case = CASES[0];
    let model = TtsModel::load(&fixture(case), Arc::new(CpuBackend::new(1))).unwrap();
    let (prompts, _) = prompts(&model, case);
    let mut options = model.default_options(true);
    options.max_new_tokens = 40;
    options.ignore_eos = true;
    let alone = unbatched(&model, &prompts[..3], &options);
    let frames = RefCell::new(0);
    let mut sequences = prompts[..3].iter().enumerate().map(|(i, prompt)| {
        let sequence = BatchSequence::new(prompt.clone(), || unreachable!("greedy"));
        Ok(if i == 1 {
            sequence.on_frame(|_| {
                *frames.borrow_mut() += 1;
                *frames.borrow() < 5
            })
        } else {
            sequence
        })
    });
    let out = generate_batch(&model, &mut sequences, &options, BatchOptions::default()).unwrap();
    assert_eq!(out.sequences[0].codes, alone[0]);
    assert_eq!(out.sequences[1].codes, alone[1][..5]);
    assert_eq!(out.sequences[2].codes, alone[2]);
    assert_eq!(alone[0].len(), 39);
    assert_eq!(alone[2].len(), 39);
}
