//! What a step of the engine decodes, decided from the requests' phases and sizes alone: pure
//! functions the scheduler (`scheduler.rs`) acts on, with no model or context, so that each
//! rule is tested on its own. A new kind of step entry (drafted tokens, media chunks) is a new
//! `Phase` of the scheduler and a new planning function here, then its decode there.

/// How many of the waiting requests at the front start now, each needing the KV cells
/// `cells` gives, in order: first come first served, while a sequence is free and the cells of
/// the requests running (`reserved`) and started fit in the context's `n_ctx`. The first that
/// does not fit waits, and so does everyone behind it.
pub fn admissions(
    waiting_cells: impl IntoIterator<Item = usize>,
    free_seqs: usize,
    reserved: usize,
    n_ctx: usize,
) -> usize {
    let mut reserved = reserved;
    let mut admitted = 0;
    for cells in waiting_cells.into_iter().take(free_seqs) {
        if reserved.saturating_add(cells) > n_ctx {
            break;
        }
        reserved += cells;
        admitted += 1;
    }
    admitted
}

/// The waiting requests this step takes out of the queue, from each one's KV cells and whether
/// it was cancelled: the indices of the cancelled ones (wherever they wait, so that they hold
/// no place in line), and how many of the others, from the front, start now (`admissions`).
pub fn queue_exits(waiting: &[(usize, bool)], free_seqs: usize, reserved: usize, n_ctx: usize) -> (Vec<usize>, usize) {
    let cancelled = (0..waiting.len()).filter(|&index| waiting[index].1).collect();
    let kept = waiting
        .iter()
        .filter(|(_, cancelled)| !cancelled)
        .map(|&(cells, _)| cells);
    (cancelled, admissions(kept, free_seqs, reserved, n_ctx))
}

/// The prompt chunks of one decode, as `(request, tokens)`, from `reading`: the requests whose
/// prompts are being read, oldest first, with the prompt tokens each has left. Each reads its
/// next `n_batch` tokens (as `prefill` reads a prompt) while they fit in `room`; the first that
/// does not fit stops the list, so a long prompt is never overtaken. Returns the room left.
pub fn prompt_chunks(
    reading: impl IntoIterator<Item = (usize, usize)>,
    mut room: usize,
    n_batch: usize,
) -> (Vec<(usize, usize)>, usize) {
    let mut chunks = Vec::new();
    for (request, left) in reading {
        if left == 0 {
            continue;
        }
        let chunk = left.min(n_batch);
        if chunk > room {
            break;
        }
        room -= chunk;
        chunks.push((request, chunk));
    }
    (chunks, room)
}

/// How many drafted tokens each generating request verifies in a decode of `n_batch` tokens,
/// from the lengths of their drafts (`wanted`, in decode order): every request's own next
/// token goes in first, then the drafts while they fit, in order, the last one cut to the room.
/// With `alike` (a KV stream per sequence), every draft is cut to the shortest: llama.cpp
/// splits such a decode into one micro-batch per run of sequences bringing the same number of
/// tokens [llama.cpp internal], and each costs about what a decode of its own does
/// (docs/benchmarks.md), so a step drafts as much for each of its requests, or nothing.
pub fn draft_lengths(wanted: &[usize], n_batch: usize, alike: bool) -> Vec<usize> {
    let mut room = n_batch.saturating_sub(wanted.len());
    if alike {
        let length = wanted
            .iter()
            .min()
            .map_or(0, |&shortest| shortest.min(room / wanted.len()));
        return vec![length; wanted.len()];
    }
    wanted
        .iter()
        .map(|&length| {
            let taken = length.min(room);
            room -= taken;
            taken
        })
        .collect()
}

/// Cuts every draft to the shortest (`draft_lengths`'s `alike`, for drafts that came out
/// shorter than asked).
pub fn cut_to_shortest<T>(drafts: &mut [Vec<T>]) {
    let shortest = drafts.iter().map(Vec::len).min().unwrap_or(0);
    for draft in drafts {
        draft.truncate(shortest);
    }
}

/// The order a decode lists requests in, from their sequence ids: ascending. With a KV stream
/// per sequence, llama.cpp puts only consecutive, increasing sequence ids in one micro-batch,
/// so any other order splits a step's decode into several [llama.cpp internal].
pub fn decode_order(seqs: &[i32]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..seqs.len()).collect();
    order.sort_by_key(|&index| seqs[index]);
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admission_is_first_come_first_served_within_free_sequences_and_kv_room() {
        // Room for 100 cells, 30 reserved by running requests.
        assert_eq!(admissions([20, 30, 10], 8, 30, 100), 3);
        // The second does not fit: it waits, and so does the third, which would.
        assert_eq!(admissions([20, 60, 10], 8, 30, 100), 1);
        // Two free sequences admit two, whatever the room.
        assert_eq!(admissions([1, 1, 1], 2, 0, 100), 2);
        assert_eq!(admissions([], 8, 0, 100), 0);
        assert_eq!(admissions([101], 8, 0, 100), 0);
        // Exactly full fits; no overflow near usize::MAX.
        assert_eq!(admissions([70], 8, 30, 100), 1);
        assert_eq!(admissions([usize::MAX, 1], 8, 1, 100), 0);
    }

    #[test]
    fn cancelled_requests_leave_the_queue_wherever_they_wait_and_block_nobody() {
        // A cancelled request at the front that would not fit: the next ones start.
        assert_eq!(
            queue_exits(&[(500, true), (20, false), (30, false)], 8, 0, 100),
            (vec![0], 2)
        );
        // Cancelled ones behind a request that waits still leave.
        assert_eq!(
            queue_exits(&[(200, false), (10, true), (10, false)], 8, 0, 100),
            (vec![1], 0)
        );
        // A cancelled request takes no free sequence.
        assert_eq!(
            queue_exits(&[(1, true), (1, false), (1, false)], 1, 0, 100),
            (vec![0], 1)
        );
        assert_eq!(queue_exits(&[], 8, 0, 100), (vec![], 0));
    }

    #[test]
    fn prompts_are_read_in_chunks_of_n_batch_oldest_first_while_they_fit() {
        // Requests 0..3 with 700, 50 and 10 tokens left; 512 a decode, chunks of 256.
        let (chunks, room) = prompt_chunks([(0, 700), (1, 50), (2, 10)], 512, 256);
        assert_eq!(chunks, vec![(0, 256), (1, 50), (2, 10)]);
        assert_eq!(room, 196);
        // A chunk that does not fit stops the list: the younger prompt is not read first.
        let (chunks, room) = prompt_chunks([(0, 300), (1, 10)], 200, 256);
        assert_eq!(chunks, vec![]);
        assert_eq!(room, 200);
        // Requests with nothing left to read take no room.
        let (chunks, _) = prompt_chunks([(0, 0), (3, 5)], 10, 256);
        assert_eq!(chunks, vec![(3, 5)]);
    }

    #[test]
    fn drafts_fill_the_room_the_generating_tokens_leave_in_order() {
        assert_eq!(draft_lengths(&[4, 0, 8], 64, false), vec![4, 0, 8]);
        // 3 tokens of their own in 10: 7 drafted tokens fit, the second draft is cut.
        assert_eq!(draft_lengths(&[4, 5, 2], 10, false), vec![4, 3, 0]);
        assert_eq!(draft_lengths(&[4, 4], 2, false), vec![0, 0]);
        assert_eq!(draft_lengths(&[], 8, false), Vec::<usize>::new());
    }

    #[test]
    fn with_a_kv_stream_per_sequence_a_step_drafts_alike_for_every_request() {
        assert_eq!(draft_lengths(&[4, 6, 8], 64, true), vec![4, 4, 4]);
        // One request not drafting: nobody drafts.
        assert_eq!(draft_lengths(&[4, 0, 8], 64, true), vec![0, 0, 0]);
        // 3 tokens of their own in 10: 2 drafted tokens each fit.
        assert_eq!(draft_lengths(&[4, 5, 2], 10, true), vec![2, 2, 2]);
        assert_eq!(draft_lengths(&[], 8, true), Vec::<usize>::new());
        let mut drafts = vec![vec![1, 2, 3], vec![4], vec![5, 6]];
        cut_to_shortest(&mut drafts);
        assert_eq!(drafts, vec![vec![1], vec![4], vec![5]]);
    }

    #[test]
    fn decodes_list_sequences_in_ascending_order() {
        assert_eq!(decode_order(&[3, 0, 2, 1]), vec![1, 3, 2, 0]);
        assert_eq!(decode_order(&[]), Vec::<usize>::new());
    }
}
