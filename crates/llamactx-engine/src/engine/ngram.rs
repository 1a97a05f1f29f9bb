//! Drafts by lookup in a sequence's own tokens: where its last tokens occurred before, the
//! tokens that followed them then.
//!
//! Of the earlier places where at least `size_ngram` of the last tokens repeat, the one whose
//! repeat reaches furthest back is taken (the most recent of equals). llama.cpp's `ngram-simple`
//! (the crate's `ngram_simple_draft`) takes the most recent repeat of exactly `size_ngram`
//! tokens, which in a reply that quotes its input is often a nearby line of the reply itself
//! (`self.items[` recurs) rather than the place in the input being quoted. A longer repeat is
//! also a surer one, so a draft is at most half as long as the repeat it follows (rounded up):
//! a repeat of 3 tokens proposes 2, one of 32 proposes 16, and a draft that would likely be
//! rejected costs less verification (docs/benchmarks.md, "Speculative decoding by n-gram
//! lookup").

use llama_cpp_4::token::LlamaToken;

/// How far back a repeat is compared: past this, every repeat is as good as another, and the
/// lookup's cost stays bounded by this times the sequence's length.
const LONGEST_COMPARED: usize = 64;

/// The tokens to draft after `sampled`, which follows `history`: at most `most`, from the
/// earlier place where the longest run (at least `size_ngram` tokens) of the sequence's last
/// tokens repeats. Empty where nothing repeats so long.
pub fn lookup_draft(history: &[LlamaToken], sampled: LlamaToken, size_ngram: usize, most: usize) -> Vec<LlamaToken> {
    let end = history.len();
    let tail = |back: usize| if back == 0 { sampled } else { history[end - back] };
    let (mut best_length, mut best_after) = (0, 0);
    // `at` is where an earlier `sampled` could stand; the draft copies what followed it.
    for at in (0..end).rev() {
        let length = (0..=at.min(LONGEST_COMPARED - 1))
            .take_while(|&back| history[at - back] == tail(back))
            .count();
        if length > best_length {
            (best_length, best_after) = (length, at + 1);
            if length == LONGEST_COMPARED {
                break;
            }
        }
    }
    if best_length < size_ngram.max(1) {
        return Vec::new();
    }
    let length = most.min(best_length.div_ceil(2));
    // What followed the repeat. Where that runs into the sequence's end, the copy goes on from
    // its own start (as LZ77's overlapping copies do), so a periodic sequence drafts its period.
    let mut draft = Vec::with_capacity(length);
    for index in best_after..best_after + length {
        let token = match index.cmp(&end) {
            std::cmp::Ordering::Less => history[index],
            std::cmp::Ordering::Equal => sampled,
            std::cmp::Ordering::Greater => draft[index - end - 1],
        };
        draft.push(token);
    }
    draft
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokens(ids: &[i32]) -> Vec<LlamaToken> {
        ids.iter().copied().map(LlamaToken).collect()
    }

    fn draft(history: &[i32], sampled: i32, size_ngram: usize, most: usize) -> Vec<i32> {
        lookup_draft(&tokens(history), LlamaToken(sampled), size_ngram, most)
            .into_iter()
            .map(|token| token.0)
            .collect()
    }

    #[test]
    fn the_longest_repeat_is_followed_not_the_most_recent() {
        // "7 1 2" then 10 11..., later "8 1 2" then 20 21...; the sequence ends "7 1 2": the
        // place after "7 1 2" is proposed though "1 2" repeats more recently.
        let history = [7, 1, 2, 10, 11, 12, 13, 14, 15, 8, 1, 2, 20, 21, 22, 23, 7, 1];
        assert_eq!(draft(&history, 2, 2, 16), [10, 11]);
        // With equally long repeats, the most recent.
        let history = [9, 1, 2, 10, 11, 12, 8, 1, 2, 20, 21, 22, 5, 1];
        assert_eq!(draft(&history, 2, 2, 16), [20]);
    }

    #[test]
    fn a_draft_is_at_most_half_its_repeat_and_at_most_most() {
        // The sequence 0..40 then 0..20 again: the repeat is 20 tokens long, the draft 10.
        let mut history: Vec<i32> = (0..40).collect();
        history.extend(0..19);
        assert_eq!(draft(&history, 19, 3, 16), (20..30).collect::<Vec<_>>());
        assert_eq!(draft(&history, 19, 3, 4), [20, 21, 22, 23]);
        assert_eq!(draft(&history, 19, 3, 0), Vec::<i32>::new());
    }

    #[test]
    fn repeats_shorter_than_size_ngram_draft_nothing() {
        let history = [1, 2, 3, 4, 5, 9, 2];
        assert_eq!(draft(&history, 3, 2, 16), [4]);
        assert_eq!(draft(&history, 3, 3, 16), Vec::<i32>::new());
        assert_eq!(draft(&history, 99, 1, 16), Vec::<i32>::new());
        assert_eq!(draft(&[], 1, 1, 16), Vec::<i32>::new());
    }

    #[test]
    fn a_repeat_running_into_the_end_continues_as_its_period() {
        // A run of one token: the most recent repeat is followed only by the sampled token, and
        // the copy goes on from the draft itself.
        let history = vec![5; 200];
        assert_eq!(draft(&history, 5, 3, 16), vec![5; 16]);
        // "1 2 1 2 1" + sampled 2: the most recent repeat "1 2 1" is followed by "2" and then
        // the sampled token.
        assert_eq!(draft(&[1, 2, 1, 2, 1], 2, 2, 16), [1, 2]);
        let mut history = [1, 2, 3].repeat(30);
        history.extend([1, 2]);
        assert_eq!(draft(&history, 3, 3, 7), [1, 2, 3, 1, 2, 3, 1]);
    }
}
