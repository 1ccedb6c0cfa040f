//! Tokens' log-probabilities in the shapes the HTTP APIs give them: OpenAI's
//! chat (`logprobs.content`), its legacy completions (`tokens`,
//! `token_logprobs`, `top_logprobs`, `text_offset`) and ollama's
//! (`logprobs`: a list like OpenAI chat's content).
use grove_proto::v1 as pb;
use serde_json::{Map, Value, json};

/// A log-probability JSON can carry: OpenAI writes -9999 where a token is
/// impossible (JSON has no infinity).
fn finite(lp: f32) -> f64 {
    if lp.is_finite() {
        f64::from(lp)
    } else {
        -9999.0
    }
}

fn entry(t: &pb::TokenLogprob) -> Value {
    json!({"token": t.token, "logprob": finite(t.logprob), "bytes": t.bytes})
}

/// One token as OpenAI's chat and ollama list it: the token, its
/// log-probability and bytes, and the alternatives in the same form.
pub fn token_json(t: &pb::TokenLogprob) -> Value {
    let mut v = entry(t);
    v["top_logprobs"] = t.top.iter().map(entry).collect();
    v
}

/// OpenAI chat's `choices[i].logprobs` over `tokens`.
pub fn chat(tokens: &[pb::TokenLogprob]) -> Value {
    json!({"content": tokens.iter().map(token_json).collect::<Vec<_>>(), "refusal": null})
}

/// A list of tokens as ollama's `logprobs` and the Responses API's output_text `logprobs` give it.
pub fn token_list(tokens: &[pb::TokenLogprob]) -> Value {
    tokens.iter().map(token_json).collect()
}

/// OpenAI's legacy completions `choices[i].logprobs` over `tokens`, the first
/// of which starts at character `offset` of the choice's text; returns the
/// offset after the last.
pub fn completion(tokens: &[pb::TokenLogprob], mut offset: usize) -> (Value, usize) {
    let mut texts = Vec::with_capacity(tokens.len());
    let mut lps = Vec::with_capacity(tokens.len());
    let mut tops = Vec::with_capacity(tokens.len());
    let mut offsets = Vec::with_capacity(tokens.len());
    for t in tokens {
        texts.push(json!(t.token));
        lps.push(json!(finite(t.logprob)));
        let mut top = Map::new();
        for alt in &t.top {
            top.insert(alt.token.clone(), json!(finite(alt.logprob)));
        }
        tops.push(Value::Object(top));
        offsets.push(json!(offset));
        offset += t.token.chars().count();
    }
    let v = json!({
        "tokens": texts, "token_logprobs": lps, "top_logprobs": tops, "text_offset": offsets,
    });
    (v, offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(id: u32, text: &str, lp: f32, top: Vec<pb::TokenLogprob>) -> pb::TokenLogprob {
        pb::TokenLogprob {
            id,
            token: text.into(),
            bytes: text.as_bytes().to_vec(),
            logprob: lp,
            top,
        }
    }

    #[test]
    fn shapes_of_each_api() {
        let alts = vec![
            token(5, " Paris", -0.25, vec![]),
            token(9, " Lyon", f32::NEG_INFINITY, vec![]),
        ];
        let toks = [token(5, " Paris", -0.25, alts), token(7, ".", -1.5, vec![])];
        let c = chat(&toks);
        assert_eq!(c["content"][0]["token"], " Paris");
        assert_eq!(c["content"][0]["bytes"], json!([32, 80, 97, 114, 105, 115]));
        assert_eq!(
            c["content"][0]["top_logprobs"][1]["logprob"],
            json!(-9999.0)
        );
        assert_eq!(c["content"][1]["top_logprobs"], json!([]));
        assert_eq!(token_list(&toks), c["content"]);
        let (legacy, end) = completion(&toks, 3);
        assert_eq!(legacy["tokens"], json!([" Paris", "."]));
        assert_eq!(legacy["token_logprobs"], json!([-0.25, -1.5]));
        assert_eq!(legacy["top_logprobs"][0][" Lyon"], json!(-9999.0));
        assert_eq!(legacy["text_offset"], json!([3, 9]));
        assert_eq!(end, 10);
    }
}
