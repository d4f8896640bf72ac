//! Where a new name's token goes: strictly between the tokens of the names
//! just below and just above it, so that token order stays name order.
//!
//! Pure: the name store decides the neighbours and makes the allocation
//! atomic; this module only picks tokens. A token is handled as its digits
//! (alphabet indexes per position, see [`super::namespace`]): continuation
//! digits are even indexes, final digits odd ones.
//!
//! - **A batch of names in a bounded gap** (or the first names of an empty
//!   dictionary) takes the shortest tokens the gap holds: every token of a
//!   length below the one needed, then evenly spaced tokens of that length,
//!   so that later names still find short tokens between them.
//! - **Names beyond the current first or last name** (a gap open on one
//!   side) take the nearest token whose length leaves as many tokens again
//!   as the dictionary already holds, so that names arriving in increasing
//!   (or decreasing) order keep tokens of logarithmic length.

use super::namespace::{alphabet_len, byte_at, index_of, is_final, Token, MAX_TOKEN_LEN};

/// No token short enough remains between two neighbours.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no token of at most {MAX_TOKEN_LEN} bytes remains between two neighbouring names")]
pub struct TooLong;

type Digits = Vec<usize>;

fn digits(t: &Token) -> Digits {
    t.as_bytes()
        .iter()
        .enumerate()
        .map(|(pos, &b)| index_of(pos, b).unwrap_or(0))
        .collect()
}

fn token(d: &[usize]) -> Token {
    let bytes: Vec<u8> = d
        .iter()
        .enumerate()
        .map(|(pos, &i)| byte_at(pos, i))
        .collect();
    Token::new_unchecked(&bytes)
}

/// The digit kinds of a length-`len` token: continuation, then final.
fn wants_final(pos: usize, len: usize) -> bool {
    pos + 1 == len
}

fn min_of(final_digit: bool) -> usize {
    usize::from(final_digit)
}

fn max_of(pos: usize, final_digit: bool) -> usize {
    alphabet_len(pos) - 1 - usize::from(final_digit)
}

/// The smallest index of the right kind above `x` at `pos`.
fn next_above(pos: usize, x: usize, final_digit: bool) -> Option<usize> {
    let mut i = x + 1;
    if is_final(i) != final_digit {
        i += 1;
    }
    (i <= max_of(pos, final_digit)).then_some(i)
}

/// The largest index of the right kind below `x` at `pos`.
fn next_below(x: usize, final_digit: bool) -> Option<usize> {
    let mut i = x.checked_sub(1)?;
    if is_final(i) != final_digit {
        i = i.checked_sub(1)?;
    }
    Some(i)
}

/// The smallest token of exactly `len` digits above `lo` (`None`: -∞).
fn smallest_above(lo: Option<&[usize]>, len: usize) -> Option<Digits> {
    let Some(lo) = lo else {
        let mut d = vec![min_of(false); len - 1];
        d.push(min_of(true));
        return Some(d);
    };
    for i in (0..lo.len().min(len)).rev() {
        let fin = wants_final(i, len);
        if let Some(next) = next_above(i, lo[i], fin) {
            let mut d = lo[..i].to_vec();
            d.push(next);
            if !fin {
                d.extend(std::iter::repeat_n(min_of(false), len - 2 - i));
                d.push(min_of(true));
            }
            return Some(d);
        }
    }
    None
}

/// The largest token of exactly `len` digits below `hi` (`None`: +∞).
fn largest_below(hi: Option<&[usize]>, len: usize) -> Option<Digits> {
    let top = |from: usize, d: &mut Digits| {
        for pos in from..len - 1 {
            d.push(max_of(pos, false));
        }
        d.push(max_of(len - 1, true));
    };
    let Some(hi) = hi else {
        let mut d = Vec::new();
        top(0, &mut d);
        return Some(d);
    };
    for i in (0..hi.len().min(len)).rev() {
        let fin = wants_final(i, len);
        if let Some(prev) = next_below(hi[i], fin) {
            let mut d = hi[..i].to_vec();
            d.push(prev);
            if !fin {
                top(i + 1, &mut d);
            }
            return Some(d);
        }
    }
    None
}

/// The digit of `d` at `pos` as a number in its kind's radix.
fn radix_digit(pos: usize, len: usize, i: usize) -> (u128, u128) {
    if wants_final(pos, len) {
        (((i - 1) / 2) as u128, ((alphabet_len(pos) - 1) / 2) as u128)
    } else {
        ((i / 2) as u128, (alphabet_len(pos).div_ceil(2)) as u128)
    }
}

/// The rank of `d` among the length-`len` tokens sharing its first `from`
/// digits (saturating: a huge count only ever means "plenty").
fn rank_from(d: &[usize], from: usize) -> u128 {
    let len = d.len();
    let mut r: u128 = 0;
    for (pos, &i) in d.iter().enumerate().skip(from) {
        let (digit, radix) = radix_digit(pos, len, i);
        r = r.saturating_mul(radix).saturating_add(digit);
    }
    r
}

/// The token of rank `r` among those of length `len` sharing `prefix`.
fn unrank(prefix: &[usize], mut r: u128, len: usize) -> Digits {
    let mut tail = Vec::new();
    for pos in (prefix.len()..len).rev() {
        let fin = wants_final(pos, len);
        let radix = radix_digit(pos, len, if fin { 1 } else { 0 }).1;
        let digit = (r % radix) as usize;
        r /= radix;
        tail.push(if fin { digit * 2 + 1 } else { digit * 2 });
    }
    tail.reverse();
    let mut d = prefix.to_vec();
    d.extend(tail);
    d
}

/// The length-`len` tokens strictly inside (lo, hi): their common prefix
/// and the range of ranks after it.
struct Span {
    prefix: Digits,
    first: u128,
    count: u128,
    len: usize,
}

fn span(lo: Option<&[usize]>, hi: Option<&[usize]>, len: usize) -> Option<Span> {
    let s = smallest_above(lo, len)?;
    let e = largest_below(hi, len)?;
    if s > e {
        return None;
    }
    let common = s.iter().zip(&e).take_while(|(a, b)| a == b).count();
    let first = rank_from(&s, common);
    let last = rank_from(&e, common);
    Some(Span {
        prefix: s[..common].to_vec(),
        first,
        count: last.saturating_sub(first).saturating_add(1),
        len,
    })
}

fn count_upto(lo: Option<&[usize]>, hi: Option<&[usize]>, len: usize) -> u128 {
    (1..=len)
        .filter_map(|l| span(lo, hi, l))
        .fold(0u128, |a, s| a.saturating_add(s.count))
}

/// Tokens for `k` new names that all fall strictly between `lo` and `hi`
/// (the tokens of their neighbours; `None` for an open end), in increasing
/// order. `existing` is how many names the dictionary already holds.
pub fn fill(
    k: usize,
    lo: Option<&Token>,
    hi: Option<&Token>,
    existing: usize,
) -> Result<Vec<Token>, TooLong> {
    let lo = lo.map(digits);
    let hi = hi.map(digits);
    match (&lo, &hi) {
        (Some(lo), None) => {
            let mut out = Vec::with_capacity(k);
            let mut at = lo.clone();
            for i in 0..k {
                at = step(Some(&at), None, existing + i)?;
                out.push(token(&at));
            }
            Ok(out)
        }
        (None, Some(hi)) => {
            let mut out = Vec::with_capacity(k);
            let mut at = hi.clone();
            for i in 0..k {
                at = step(None, Some(&at), existing + i)?;
                out.push(token(&at));
            }
            out.reverse();
            Ok(out)
        }
        _ => spread(k, lo.as_deref(), hi.as_deref()),
    }
}

/// One token beyond the last (`lo`) or before the first (`hi`) name,
/// leaving room for as many names again as `reserve`.
fn step(lo: Option<&[usize]>, hi: Option<&[usize]>, reserve: usize) -> Result<Digits, TooLong> {
    let need = reserve.max(1) as u128;
    let len = (1..=MAX_TOKEN_LEN)
        .find(|&l| count_upto(lo, hi, l) >= need)
        .ok_or(TooLong)?;
    let candidates = (1..=len).filter_map(|l| match lo {
        Some(_) => smallest_above(lo, l),
        None => largest_below(hi, l),
    });
    let best = if lo.is_some() {
        candidates.min()
    } else {
        candidates.max()
    };
    best.ok_or(TooLong)
}

/// `k` tokens in a bounded gap: the shortest ones, spread evenly.
fn spread(k: usize, lo: Option<&[usize]>, hi: Option<&[usize]>) -> Result<Vec<Token>, TooLong> {
    if k == 0 {
        return Ok(Vec::new());
    }
    let want = k as u128;
    let len = (1..=MAX_TOKEN_LEN)
        .find(|&l| count_upto(lo, hi, l) >= want)
        .ok_or(TooLong)?;
    let mut chosen: Vec<Digits> = Vec::with_capacity(k);
    for l in 1..len {
        if let Some(s) = span(lo, hi, l) {
            for r in 0..s.count {
                chosen.push(unrank(&s.prefix, s.first + r, s.len));
            }
        }
    }
    let need = (k - chosen.len()) as u128;
    let s = span(lo, hi, len).ok_or(TooLong)?;
    for i in 0..need {
        // The middle of each of `need` equal parts of the span.
        let offset = s.count.checked_mul(2 * i + 1).map_or(i, |x| x / (2 * need));
        chosen.push(unrank(&s.prefix, s.first + offset, s.len));
    }
    chosen.sort();
    chosen.dedup();
    if chosen.len() != k {
        return Err(TooLong);
    }
    Ok(chosen.iter().map(|d| token(d)).collect())
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    /// A dictionary grown only through `fill`, checking order after each batch.
    #[derive(Default)]
    struct Sim(BTreeMap<String, Token>);

    impl Sim {
        fn add(&mut self, batch: &[String]) {
            let mut new: Vec<&String> = batch.iter().filter(|n| !self.0.contains_key(*n)).collect();
            new.sort();
            new.dedup();
            let mut gaps: BTreeMap<Option<String>, Vec<&String>> = BTreeMap::new();
            for n in new {
                let below = self
                    .0
                    .range::<String, _>(..n.clone())
                    .next_back()
                    .map(|(k, _)| k.clone());
                gaps.entry(below).or_default().push(n);
            }
            let existing = self.0.len();
            let mut assigned = Vec::new();
            for (below, names) in gaps {
                let lo = below.as_ref().map(|b| self.0[b]);
                let hi = self
                    .0
                    .range::<String, _>(names[0].clone()..)
                    .next()
                    .map(|(_, t)| *t);
                let tokens = fill(names.len(), lo.as_ref(), hi.as_ref(), existing).unwrap();
                assigned.extend(names.into_iter().cloned().zip(tokens));
            }
            self.0.extend(assigned);
            let tokens: Vec<&Token> = self.0.values().collect();
            assert!(tokens.windows(2).all(|w| w[0] < w[1]), "order broken");
            for t in tokens {
                assert_eq!(Token::from_bytes(t.as_bytes()), Some(*t));
            }
        }

        fn mean_len(&self) -> f64 {
            self.0.values().map(|t| t.len() as f64).sum::<f64>() / self.0.len() as f64
        }
    }

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("attribute {i:05}")).collect()
    }

    #[test]
    fn a_first_batch_takes_the_one_byte_tokens() {
        let mut d = Sim::default();
        d.add(&names(15));
        assert!(d.0.values().all(|t| t.len() == 1));
        let mut d = Sim::default();
        d.add(&names(30));
        assert_eq!(d.mean_len(), 1.5);
    }

    #[test]
    fn names_in_increasing_order_keep_short_tokens() {
        let mut d = Sim::default();
        for n in names(1000) {
            d.add(&[n]);
        }
        assert!(d.0.values().all(|t| t.len() <= 3), "{}", d.mean_len());
        let mut d = Sim::default();
        for n in names(1000).into_iter().rev() {
            d.add(&[n]);
        }
        assert!(d.0.values().all(|t| t.len() <= 3), "{}", d.mean_len());
    }

    #[test]
    fn tokens_between_close_neighbours_still_exist() {
        let lo = Token::from_bytes(b"\x03!\"").unwrap(); // c1 c0 f1
        let hi = Token::from_bytes(b"\x03!#\"").unwrap(); // c1 c0 c1 f1
        let t = fill(3, Some(&lo), Some(&hi), 2).unwrap();
        assert!(
            lo < t[0] && t[0] < t[1] && t[1] < t[2] && t[2] < hi,
            "{t:?}"
        );
    }

    proptest! {
        #[test]
        fn any_arrival_order_keeps_token_order(order in prop::collection::vec(0usize..400, 1..200), batch in 1usize..12) {
            let all = names(400);
            let picked: Vec<String> = order.iter().map(|&i| all[i].clone()).collect();
            let mut d = Sim::default();
            for chunk in picked.chunks(batch) {
                d.add(chunk);
            }
        }
    }
}
