//! What a drafted token costs on this machine, against what a step without drafts yields, and
//! so the least share of its drafted tokens a request must see accepted for drafting to pay.
//!
//! A step decodes every generating request's token and the drafted ones, `rows` in all; its
//! decode takes about `fixed + per_row * rows` seconds, fitted here over recent steps. With `n`
//! requests and no drafts it samples `n` tokens in `fixed + per_row * n`. Drafting `k` tokens
//! more, of which `e` are accepted, costs `(per_row + proposing) * k` (proposing: what finding
//! a drafted token cost) and yields `e` tokens more; the rate rises exactly when
//! `e / k > (per_row + proposing) * n / (fixed + per_row * n)` (sampling's cost, per token
//! sampled either way, cancels out). On a GPU a row costs almost nothing and any acceptance
//! pays; on a CPU a decode of several sequences is bound by compute: on the 2-core VM of
//! docs/benchmarks.md, about half of the drafted tokens must be accepted at 1 request and most
//! of them at 8.

/// The weight a step keeps at the next: half of it after about 140 steps, so the fit follows
/// slow changes (the sequences' lengths) but not one noisy step.
const DECAY: f64 = 0.995;
/// The least spread (variance, in rows squared) of the steps' rows that a slope is fitted from:
/// below it, the steps measured about one size of decode, and the cost of a row is unknown.
const LEAST_ROWS_VARIANCE: f64 = 0.25;
/// Recent steps' decode seconds against their rows (exponentially weighted sums for a least
/// squares fit), and the seconds spent proposing drafted tokens.
#[derive(Debug, Default)]
pub struct DraftCosts {
    weight: f64,
    rows: f64,
    rows_squared: f64,
    seconds: f64,
    rows_seconds: f64,
    proposing_seconds: f64,
    proposed: f64,
}

impl DraftCosts {
    /// Records a step's decode of `rows` tokens (every one with an output) in `seconds`.
    pub fn record_decode(&mut self, rows: usize, seconds: f64) {
        // Row counts are far below 2**52.
        #[allow(clippy::cast_precision_loss)]
        let rows = rows as f64;
        self.weight = DECAY * self.weight + 1.0;
        self.rows = DECAY * self.rows + rows;
        self.rows_squared = DECAY * self.rows_squared + rows * rows;
        self.seconds = DECAY * self.seconds + seconds;
        self.rows_seconds = DECAY * self.rows_seconds + rows * seconds;
    }

    /// Records that proposing `tokens` drafted tokens took `seconds`.
    pub fn record_proposing(&mut self, tokens: usize, seconds: f64) {
        if tokens == 0 {
            return;
        }
        #[allow(clippy::cast_precision_loss)]
        let tokens = tokens as f64;
        self.proposing_seconds = DECAY * self.proposing_seconds + seconds;
        self.proposed = DECAY * self.proposed + tokens;
    }

    /// The share of a request's drafted tokens that must be accepted for its drafts to raise
    /// the rate of a step of `generating` requests; None until the steps measured decodes of
    /// different sizes. 1 or more: not even drafts accepted whole pay (a draft model that costs
    /// nearly what the target does).
    pub fn least_acceptance(&self, generating: usize) -> Option<f64> {
        if self.weight <= 0.0 {
            return None;
        }
        let mean_rows = self.rows / self.weight;
        let mean_seconds = self.seconds / self.weight;
        let variance = self.rows_squared / self.weight - mean_rows * mean_rows;
        if variance < LEAST_ROWS_VARIANCE || mean_rows <= 0.0 {
            return None;
        }
        // A decode costs something of its own (fixed >= 0) and its rows cost nothing less than
        // nothing: a fit outside these bounds is noise from a narrow spread of rows.
        let slope = (self.rows_seconds / self.weight - mean_rows * mean_seconds) / variance;
        let per_row = slope.clamp(0.0, mean_seconds / mean_rows);
        let fixed = mean_seconds - per_row * mean_rows;
        let proposing = if self.proposed > 0.0 {
            self.proposing_seconds / self.proposed
        } else {
            0.0
        };
        #[allow(clippy::cast_precision_loss)]
        let generating = generating as f64;
        let plain = fixed + per_row * generating;
        (plain > 0.0).then(|| (per_row + proposing) * generating / plain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The costs of docs/benchmarks.md's 2-core VM: 6.2 ms a decode and 5.8 ms a row.
    fn measured(rows: impl IntoIterator<Item = usize>) -> DraftCosts {
        let mut costs = DraftCosts::default();
        for rows in rows {
            #[allow(clippy::cast_precision_loss)]
            costs.record_decode(rows, 0.0062 + 0.0058 * rows as f64);
        }
        costs
    }

    #[test]
    fn the_least_acceptance_follows_the_fitted_costs_of_a_row_and_a_decode() {
        let costs = measured([1, 5, 17, 8, 40, 9]);
        let at_one = costs.least_acceptance(1).expect("decodes of several sizes");
        assert!((at_one - 0.0058 / 0.012).abs() < 1e-6, "{at_one}");
        let at_eight = costs.least_acceptance(8).expect("decodes of several sizes");
        assert!(
            (at_eight - 8.0 * 0.0058 / (0.0062 + 8.0 * 0.0058)).abs() < 1e-6,
            "{at_eight}"
        );
        // Proposing costs too: a drafted token must save its verification and its finding.
        let mut drafting = measured([1, 5, 17, 8, 40, 9]);
        drafting.record_proposing(10, 0.01);
        let with_proposing = drafting.least_acceptance(1).expect("decodes of several sizes");
        assert!(
            (with_proposing - (0.0058 + 0.001) / 0.012).abs() < 1e-6,
            "{with_proposing}"
        );
    }

    #[test]
    fn without_decodes_of_different_sizes_the_cost_of_a_row_is_unknown() {
        assert_eq!(DraftCosts::default().least_acceptance(1), None);
        assert_eq!(measured([8; 50]).least_acceptance(8), None);
        // A fit that makes a decode cost less than nothing of its own is bounded: rows cost
        // their share of the decodes' mean, and no draft pays.
        let mut superlinear = DraftCosts::default();
        for rows in [8, 9, 8, 10, 8] {
            #[allow(clippy::cast_precision_loss)]
            superlinear.record_decode(rows, 0.006 * rows as f64 - 0.01);
        }
        let bounded = superlinear.least_acceptance(8).expect("decodes of several sizes");
        assert!((bounded - 1.0).abs() < 1e-9, "{bounded}");
        // Rows that cost nothing measurable (a GPU): any acceptance pays.
        let mut free_rows = DraftCosts::default();
        for rows in [1, 9, 17, 4] {
            free_rows.record_decode(rows, 0.002);
        }
        let free = free_rows.least_acceptance(4).expect("decodes of several sizes");
        assert!(free.abs() < 1e-9, "{free}");
    }

    #[test]
    fn steps_without_drafts_forget_the_fit_so_drafting_is_measured_again() {
        let mut costs = measured([1, 17, 1, 17, 1, 17]);
        assert!(costs.least_acceptance(1).is_some());
        for _ in 0..1000 {
            costs.record_decode(1, 0.012);
        }
        assert_eq!(costs.least_acceptance(1), None);
    }
}
