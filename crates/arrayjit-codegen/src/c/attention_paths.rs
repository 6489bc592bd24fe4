//! Which of the attention helper's run-time features (`c/attention.rs`) a library's passes use —
//! dropout, a key bias, the causal mask or none, packed or transposed operands — so that its
//! unit turns the others into constants and gcc never compiles their code; and the comment by
//! which a rendered unit says which it kept.

use arrayjit_opt::schedule::{ATTENTION_BLOCK_KEYS, ATTENTION_BLOCK_QUERIES, Blocking};

/// The features some attention pass of a library uses. A feature no pass uses becomes a
/// constant of the unit (its branches fold away: for the GPT demo's one combination the unit
/// compiles in 0.415 s instead of 0.525 on an AMD EPYC Zen 4), so every pass runs the code it
/// ran with the whole unit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AttentionPaths {
    /// Some pass drops weights.
    pub dropout: bool,
    /// Some pass adds a key bias to its scores.
    pub bias: bool,
    /// Some pass is causal.
    pub causal: bool,
    /// Some pass is not causal.
    pub unmasked: bool,
    /// Some pass's operands fit the packed products (see `aj_att_packs`).
    pub packed: bool,
    /// Some pass's operands do not (the transposed operands' products).
    pub transposed: bool,
}

/// The comment that opens a rendered unit's list of the features it kept.
const MARKER: &str = "/* attention paths:";

impl AttentionPaths {
    /// Every feature: the whole unit.
    pub const ALL: AttentionPaths = AttentionPaths {
        dropout: true,
        bias: true,
        causal: true,
        unmasked: true,
        packed: true,
        transposed: true,
    };

    /// The features of one pass: whether it drops weights, adds a key bias and is causal, and
    /// whether its `features` and `value_features` fit the packed products on blocking `b`
    /// (the rule of the unit's `aj_att_packs`).
    pub fn of_pass(
        dropout: bool,
        bias: bool,
        causal: bool,
        (features, value_features): (usize, usize),
        b: &Blocking,
    ) -> AttentionPaths {
        let packs = features <= b.kc
            && value_features <= b.kc
            && ATTENTION_BLOCK_KEYS <= b.kc
            && ATTENTION_BLOCK_QUERIES <= b.kc
            && ATTENTION_BLOCK_KEYS.is_multiple_of(b.nr)
            && ATTENTION_BLOCK_QUERIES.is_multiple_of(b.nr);
        AttentionPaths {
            dropout,
            bias,
            causal,
            unmasked: !causal,
            packed: packs,
            transposed: !packs,
        }
    }

    /// The features either uses.
    pub fn union(self, other: AttentionPaths) -> AttentionPaths {
        AttentionPaths {
            dropout: self.dropout || other.dropout,
            bias: self.bias || other.bias,
            causal: self.causal || other.causal,
            unmasked: self.unmasked || other.unmasked,
            packed: self.packed || other.packed,
            transposed: self.transposed || other.transposed,
        }
    }

    /// The unit's macros for these features (each a field of the passes' context, or the
    /// constant every pass of the library has), after the comment that lists them.
    pub(crate) fn macros(self) -> String {
        let flag = |on: bool| u8::from(on);
        let either = |yes: bool, no: bool, read: &str| match (yes, no) {
            (true, false) => "1".to_string(),
            (false, true) => "0".to_string(),
            _ => read.to_string(),
        };
        let packs = match (self.packed, self.transposed) {
            (true, true) | (false, false) => "aj_att_packs(E, Ev)",
            (true, false) => "1",
            (false, true) => "0",
        };
        format!(
            "{MARKER} dropout={} bias={} causal={} unmasked={} packed={} transposed={} */\n\
             #define AJ_ATT_DROP(c) {}\n\
             #define AJ_ATT_KBIAS(c) {}\n\
             #define AJ_ATT_CAUSAL(c) {}\n\
             #ifdef AJ_ATT_NO_PACK\n#define AJ_ATT_PACKS(E, Ev) aj_att_packs(E, Ev)\n#else\n\
             #define AJ_ATT_PACKS(E, Ev) {packs}\n#endif",
            flag(self.dropout),
            flag(self.bias),
            flag(self.causal),
            flag(self.unmasked),
            flag(self.packed),
            flag(self.transposed),
            if self.dropout { "((c)->drop)" } else { "0" },
            if self.bias {
                "((c)->kbias)"
            } else {
                "((const float *)0)"
            },
            either(self.causal, self.unmasked, "((c)->causal)"),
        )
    }

    /// The features a rendered unit kept (read from its comment; `None` without one).
    pub(crate) fn of_definition(definition: &str) -> Option<AttentionPaths> {
        let start = definition.find(MARKER)? + MARKER.len();
        let line = &definition[start..];
        let line = &line[..line.find("*/")?];
        let mut paths = AttentionPaths::default();
        for field in line.split_whitespace() {
            let (name, value) = field.split_once('=')?;
            let on = value == "1";
            match name {
                "dropout" => paths.dropout = on,
                "bias" => paths.bias = on,
                "causal" => paths.causal = on,
                "unmasked" => paths.unmasked = on,
                "packed" => paths.packed = on,
                "transposed" => paths.transposed = on,
                _ => return None,
            }
        }
        Some(paths)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrayjit_opt::schedule::StreamFetch;

    const B: Blocking = Blocking {
        mr: 12,
        nr: 32,
        mc: 768,
        kc: 512,
        nc: 1024,
        stream_fetch: StreamFetch::L2,
    };

    #[test]
    fn a_pass_s_features_and_their_union() {
        let demo = AttentionPaths::of_pass(false, false, true, (32, 32), &B);
        assert_eq!(
            demo,
            AttentionPaths {
                causal: true,
                packed: true,
                ..AttentionPaths::default()
            }
        );
        // Features wider than the depth block take the transposed operands.
        let wide = AttentionPaths::of_pass(true, true, false, (1024, 64), &B);
        assert!(wide.transposed && !wide.packed && wide.unmasked && wide.dropout && wide.bias);
        assert_eq!(demo.union(wide), AttentionPaths::ALL);
    }

    #[test]
    fn the_macros_fold_what_no_pass_uses_and_say_so() {
        let demo = AttentionPaths::of_pass(false, false, true, (32, 32), &B);
        // The macros hold each line, and their comment reads back as the same paths.
        let check = |paths: AttentionPaths, lines: [&str; 4]| {
            let m = paths.macros();
            for line in lines {
                assert!(m.contains(line), "{line}\n{m}");
            }
            assert_eq!(AttentionPaths::of_definition(&m), Some(paths));
        };
        check(
            demo,
            [
                "#define AJ_ATT_DROP(c) 0",
                "#define AJ_ATT_KBIAS(c) ((const float *)0)",
                "#define AJ_ATT_CAUSAL(c) 1",
                "#define AJ_ATT_PACKS(E, Ev) 1",
            ],
        );
        check(
            AttentionPaths::ALL,
            [
                "#define AJ_ATT_DROP(c) ((c)->drop)",
                "#define AJ_ATT_KBIAS(c) ((c)->kbias)",
                "#define AJ_ATT_CAUSAL(c) ((c)->causal)",
                "#define AJ_ATT_PACKS(E, Ev) aj_att_packs(E, Ev)",
            ],
        );
        assert_eq!(AttentionPaths::of_definition("no comment"), None);
    }
}
