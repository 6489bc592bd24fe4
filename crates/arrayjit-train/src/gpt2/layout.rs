//! Hugging Face's GPT-2 tensor layout (`model.safetensors`) against arrayjit's GPT parameters.
//!
//! | Hugging Face | arrayjit |
//! |---|---|
//! | `wte.weight` `[vocab, d]` | token embedding (also the tied output head) |
//! | `wpe.weight` `[positions, d]` | position embedding |
//! | `h.{i}.ln_1.weight`, `.bias` | block `i`'s first norm |
//! | `h.{i}.attn.c_attn.weight` `[d, 3d]` (a `Conv1D`: `[in, out]`) | the query, key and value projections `[d, heads, head_width]`, columns `0..d`, `d..2d`, `2d..3d` |
//! | `h.{i}.attn.c_attn.bias` `[3d]` | their biases `[heads, head_width]` |
//! | `h.{i}.attn.c_proj.weight` `[d, d]`, `.bias` | the output projection `[heads, head_width, d]` (the same bytes) |
//! | `h.{i}.ln_2` | the second norm |
//! | `h.{i}.mlp.c_fc.weight` `[d, 4d]`, `.bias` | the MLP's up projection |
//! | `h.{i}.mlp.c_proj.weight` `[4d, d]`, `.bias` | its down projection |
//! | `ln_f` | the final norm |
//!
//! Names may carry `GPT2LMHeadModel`'s `transformer.` prefix or not (the Hub's `gpt2` does
//! not); `lm_head.weight`, where present, must equal `wte.weight` (a tied head); the attention
//! modules' causal-mask buffers (`attn.bias`, `attn.masked_bias`) of older checkpoints are
//! ignored. Writing uses the `transformer.` prefix, as `GPT2LMHeadModel.save_pretrained` does.

use arrayjit_tensor::Tensor;
use arrayjit_tensor::nn::Gpt;

/// Part of a stored tensor viewed as `[rows, cols]`: columns `first..first + width` of every
/// row hold one parameter (row-major, in the parameter's own shape).
pub(crate) struct Piece {
    /// The parameter.
    pub param: Tensor,
    /// Its first column.
    pub first: usize,
}

/// One stored tensor and the parameters it holds.
pub(crate) struct Stored {
    /// Its name without the prefix.
    pub name: String,
    /// Its shape.
    pub shape: Vec<usize>,
    /// Rows when viewed as `[rows, cols]`.
    pub rows: usize,
    /// The parameters in it, side by side.
    pub pieces: Vec<Piece>,
}

impl Stored {
    fn whole(name: String, param: &Tensor, shape: Vec<usize>) -> Stored {
        Stored {
            name,
            shape,
            rows: 1,
            pieces: vec![Piece {
                param: param.clone(),
                first: 0,
            }],
        }
    }

    fn same(name: String, param: &Tensor) -> Stored {
        Stored::whole(name, param, param.dims().to_vec())
    }

    /// Columns per row.
    pub fn cols(&self) -> usize {
        self.shape.iter().product::<usize>() / self.rows.max(1)
    }

    /// Splits the stored values into each piece's values.
    pub fn split(&self, values: &[f64]) -> Vec<Vec<f64>> {
        let cols = self.cols();
        self.pieces
            .iter()
            .map(|p| {
                let n: usize = p.param.dims().iter().product();
                let width = n / self.rows.max(1);
                let mut out = Vec::with_capacity(n);
                for r in 0..self.rows {
                    let at = r * cols + p.first;
                    out.extend_from_slice(&values[at..at + width]);
                }
                out
            })
            .collect()
    }

    /// Joins the pieces' values (each in its parameter's order) into the stored tensor's.
    pub fn join(&self, pieces: &[Vec<f64>]) -> Vec<f64> {
        let cols = self.cols();
        let mut out = vec![0.0; self.rows * cols];
        for (p, values) in self.pieces.iter().zip(pieces) {
            let width = values.len() / self.rows.max(1);
            for r in 0..self.rows {
                let at = r * cols + p.first;
                out[at..at + width].copy_from_slice(&values[r * width..(r + 1) * width]);
            }
        }
        out
    }
}

/// Every stored tensor of `model` in Hugging Face's layout (names without the prefix).
pub(crate) fn layout(model: &Gpt) -> Vec<Stored> {
    let c = &model.config;
    let d = c.width;
    let mut out = vec![
        Stored::same("wte.weight".into(), &model.token_embedding),
        Stored::same("wpe.weight".into(), &model.position_embedding),
    ];
    for (i, b) in model.blocks.iter().enumerate() {
        let h = format!("h.{i}");
        let a = &b.attention;
        out.push(Stored::same(format!("{h}.ln_1.weight"), &b.norm1.gain));
        out.push(Stored::same(format!("{h}.ln_1.bias"), &b.norm1.bias));
        let parts = |params: [&Tensor; 3]| -> Vec<Piece> {
            params
                .iter()
                .enumerate()
                .map(|(k, p)| Piece {
                    param: (*p).clone(),
                    first: k * d,
                })
                .collect()
        };
        out.push(Stored {
            name: format!("{h}.attn.c_attn.weight"),
            shape: vec![d, 3 * d],
            rows: d,
            pieces: parts([&a.query, &a.key, &a.value]),
        });
        out.push(Stored {
            name: format!("{h}.attn.c_attn.bias"),
            shape: vec![3 * d],
            rows: 1,
            pieces: parts([&a.biases[0], &a.biases[1], &a.biases[2]]),
        });
        out.push(Stored::whole(
            format!("{h}.attn.c_proj.weight"),
            &a.output,
            vec![d, d],
        ));
        out.push(Stored::same(format!("{h}.attn.c_proj.bias"), &a.biases[3]));
        out.push(Stored::same(format!("{h}.ln_2.weight"), &b.norm2.gain));
        out.push(Stored::same(format!("{h}.ln_2.bias"), &b.norm2.bias));
        for (name, linear) in [("c_fc", &b.mlp.up), ("c_proj", &b.mlp.down)] {
            out.push(Stored::same(
                format!("{h}.mlp.{name}.weight"),
                &linear.weight,
            ));
            if let Some(bias) = &linear.bias {
                out.push(Stored::same(format!("{h}.mlp.{name}.bias"), bias));
            }
        }
    }
    out.push(Stored::same("ln_f.weight".into(), &model.final_norm.gain));
    out.push(Stored::same("ln_f.bias".into(), &model.final_norm.bias));
    out
}
