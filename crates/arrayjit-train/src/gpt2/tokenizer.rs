//! GPT-2's byte-level BPE tokenizer, through Hugging Face's `tokenizers` crate (the
//! implementation `transformers` itself runs): from `vocab.json` + `merges.txt`, or a
//! `tokenizer.json`.

use std::path::Path;

use arrayjit_ir::{Error, Result};
use tokenizers::Tokenizer;
use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;

/// GPT-2's tokenizer: text to token ids and back.
pub struct Gpt2Tokenizer {
    inner: Tokenizer,
    vocabulary: usize,
}

fn failed(what: String, e: impl std::fmt::Display) -> Error {
    Error::Checkpoint {
        path: what,
        detail: format!("the tokenizer could not be read: {e}"),
    }
}

impl Gpt2Tokenizer {
    /// The tokenizer of `vocab.json` (token → id) and `merges.txt` (the BPE merges, most
    /// frequent first), byte-level as GPT-2's: no prefix space, no normalization, the
    /// pre-tokenizer's regular expression splitting words, numbers, punctuation and spaces.
    pub fn from_files(vocab: &Path, merges: &Path) -> Result<Gpt2Tokenizer> {
        let (v, m) = (vocab.to_string_lossy(), merges.to_string_lossy());
        for p in [vocab, merges] {
            if !p.is_file() {
                return Err(Error::io(
                    format!("reading the tokenizer file {}", p.display()),
                    std::io::Error::new(std::io::ErrorKind::NotFound, "no such file"),
                ));
            }
        }
        let bpe = BPE::from_file(&v, &m)
            .build()
            .map_err(|e| failed(format!("{v} and {m}"), e))?;
        let mut inner = Tokenizer::new(bpe);
        inner
            .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
            .with_decoder(Some(ByteLevel::default()))
            .with_post_processor(Some(ByteLevel::default().trim_offsets(false)));
        Ok(Gpt2Tokenizer::wrap(inner))
    }

    /// A tokenizer saved as one `tokenizer.json` (what `transformers`' fast tokenizers save).
    pub fn from_json(path: &Path) -> Result<Gpt2Tokenizer> {
        let inner =
            Tokenizer::from_file(path).map_err(|e| failed(path.display().to_string(), e))?;
        Ok(Gpt2Tokenizer::wrap(inner))
    }

    /// The tokenizer in a model directory: `tokenizer.json` if there is one, else `vocab.json`
    /// and `merges.txt`.
    pub fn from_pretrained(dir: &Path) -> Result<Gpt2Tokenizer> {
        let json = dir.join("tokenizer.json");
        if json.is_file() {
            return Gpt2Tokenizer::from_json(&json);
        }
        Gpt2Tokenizer::from_files(&dir.join("vocab.json"), &dir.join("merges.txt"))
    }

    fn wrap(inner: Tokenizer) -> Gpt2Tokenizer {
        let vocabulary = inner.get_vocab_size(true);
        Gpt2Tokenizer { inner, vocabulary }
    }

    /// Number of ids (50257 for GPT-2's files).
    pub fn vocabulary(&self) -> usize {
        self.vocabulary
    }

    /// The ids of `text`.
    pub fn encode(&self, text: &str) -> Result<Vec<usize>> {
        let encoding = self
            .inner
            .encode(text, false)
            .map_err(|e| Error::invalid(format!("tokenizing {text:?}: {e}")))?;
        Ok(encoding.get_ids().iter().map(|&i| i as usize).collect())
    }

    /// The text of `ids`; bytes that do not form UTF-8 (a character split across the ends of
    /// `ids`) become U+FFFD. An id outside the vocabulary is an error.
    pub fn decode(&self, ids: &[usize]) -> Result<String> {
        let ids = ids
            .iter()
            .map(|&i| {
                u32::try_from(i)
                    .ok()
                    .filter(|&u| self.inner.id_to_token(u).is_some())
                    .ok_or_else(|| Error::BadValue {
                        what: "a token id to decode".into(),
                        value: i.to_string(),
                        expected: format!("an id of the vocabulary (below {})", self.vocabulary),
                    })
            })
            .collect::<Result<Vec<u32>>>()?;
        self.inner
            .decode(&ids, false)
            .map_err(|e| Error::invalid(format!("decoding {} ids: {e}", ids.len())))
    }
}
