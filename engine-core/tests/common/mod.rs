//! Helpers shared by the engine's integration tests.

pub mod lm_fixtures;
pub mod seeded_weights;
