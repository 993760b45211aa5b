//! What a Base model needs to clone a voice, computed once from a reference recording: the speaker encoder's
//! x-vector ([`crate::speaker_encoder`]) and, for in-context cloning, the codec encoder's reference codes
//! ([`crate::codec::encoder`]), as the official `create_voice_clone_prompt` makes them.

use std::path::Path;
use std::sync::Arc;

use kazeia_backend_abi::Backend;

use crate::codec::encoder::CodecEncoder;
use crate::error::{Error, Result};
use crate::lm::ModelConfig;
use crate::speaker_encoder::SpeakerEncoder;
use crate::weights::WeightFile;

/// The two encoders of a Base model directory.
pub struct VoiceEncoders {
    backend: Arc<dyn Backend>,
    pub speaker: SpeakerEncoder,
    pub codec: CodecEncoder,
}

impl VoiceEncoders {
    /// Loads `speaker_encoder.*` of `model.safetensors` and the encoder of `speech_tokenizer/`.
    pub fn load(dir: &Path, backend: Arc<dyn Backend>) -> Result<Self> {
        let config = ModelConfig::load(&dir.join("config.json"))?;
        if config.model_type() != "base" {
            return Err(Error::Input(format!(
                "{} is a {} model; voices are cloned with a Base model (Qwen3-TTS-12Hz-*-Base)",
                dir.display(),
                config.model_type()
            )));
        }
        let se_config = config.speaker_encoder_config.clone().ok_or_else(|| {
            Error::Input(format!(
                "{}: config.json has no speaker_encoder_config",
                dir.display()
            ))
        })?;
        if se_config.enc_dim != config.talker_config.hidden_size {
            return Err(Error::Input(format!(
                "{}: the speaker encoder makes {} values, the talker takes {}",
                dir.display(),
                se_config.enc_dim,
                config.talker_config.hidden_size
            )));
        }
        let file = WeightFile::open(&dir.join("model.safetensors"))?;
        let speaker = SpeakerEncoder::load(backend.as_ref(), &file, se_config)?;
        let codec = CodecEncoder::load(dir, backend.as_ref())?;
        Ok(VoiceEncoders {
            backend,
            speaker,
            codec,
        })
    }

    /// The x-vector of 24 kHz mono audio.
    pub fn xvector(&self, wav: &[f32]) -> Result<Vec<f32>> {
        self.speaker.embed(self.backend.as_ref(), wav)
    }

    /// The reference codes of 24 kHz mono audio, `[frame][codebook]`.
    pub fn reference_codes(&self, wav: &[f32]) -> Result<Vec<Vec<u32>>> {
        self.codec.encode(self.backend.as_ref(), wav)
    }
}
