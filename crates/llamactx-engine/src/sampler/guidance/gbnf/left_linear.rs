//! Right recursion rewritten as left recursion.
//!
//! An Earley parser (llguidance's) keeps one item per open level of a right recursion, and when
//! every level could end at the current character (`until ::= "" | [^<] until`, followed by more
//! text) it completes all of them there: work that grows with the text so far. llama.cpp's
//! tool-call grammars (their "until" rules, which allow any text before a call) passed
//! llguidance's item limit after a few dozen characters, and the constraint then refused every
//! token. A group of rules that recur only at their ends is right-linear and describes a regular
//! language; written left-recursive instead (each rule then stands for "the text from where the
//! group was entered up to here"), the parser keeps the same few items at every character.

use std::collections::HashMap;

use super::{alternatives, lark_name, sequence_lark, Alt};

/// The most alternatives the rewrite writes for one group (a copy of the group per rule that
/// enters it); a larger group is left as it is.
const MAX_REWRITTEN: usize = 100_000;

/// Every rule of `defined` as (Lark name, Lark body), sorted by name, with right-linear groups
/// rewritten as left-recursive ones.
pub(super) fn rules(defined: &HashMap<&str, Vec<Alt<'_>>>, root: &str) -> Vec<(String, String)> {
    let mut names: Vec<&str> = defined.keys().copied().collect();
    names.sort_unstable();
    let index: HashMap<&str, usize> = names.iter().enumerate().map(|(i, name)| (*name, i)).collect();
    let edges: Vec<Vec<usize>> = names
        .iter()
        .map(|name| {
            let mut to: Vec<usize> = defined[name]
                .iter()
                .flat_map(|alt| alt.refs.iter().filter_map(|rule| index.get(rule).copied()))
                .collect();
            to.sort_unstable();
            to.dedup();
            to
        })
        .collect();
    let groups = components(&edges);
    let mut group_of = vec![0; names.len()];
    for (number, group) in groups.iter().enumerate() {
        for &member in group {
            group_of[member] = number;
        }
    }
    // Whether a rule is entered from outside its group (or is where the grammar starts).
    let mut entered: Vec<bool> = names.iter().map(|name| *name == root).collect();
    for (from, to) in edges.iter().enumerate() {
        for &to in to {
            if group_of[to] != group_of[from] {
                entered[to] = true;
            }
        }
    }
    let mut out = Vec::new();
    for (number, group) in groups.iter().enumerate() {
        let members: Vec<&str> = group.iter().map(|&i| names[i]).collect();
        let entries: Vec<&str> = group.iter().filter(|&&i| entered[i]).map(|&i| names[i]).collect();
        let recursive = group.len() > 1 || edges[group[0]].contains(&group[0]);
        if recursive && right_linear(defined, &members) && fits(defined, &members, entries.len()) {
            for (copy, entry) in entries.into_iter().enumerate() {
                out.extend(left_recursive(defined, &members, entry, &format!("l{number}_{copy}")));
            }
        } else {
            out.extend(
                members
                    .iter()
                    .map(|name| (lark_name(name), alternatives(&defined[name]))),
            );
        }
    }
    out.sort_unstable();
    out
}

/// Whether every reference between `members` is a bare reference at the end of an alternative,
/// and some alternative leaves the group (else the group matches nothing, and stays as it is).
fn right_linear(defined: &HashMap<&str, Vec<Alt<'_>>>, members: &[&str]) -> bool {
    let inside = |alt: &Alt<'_>| alt.refs.iter().filter(|rule| members.contains(rule)).count();
    let alts = || members.iter().flat_map(|name| &defined[name]);
    alts().all(|alt| inside(alt) == usize::from(alt.tail.is_some_and(|tail| members.contains(&tail))))
        && alts().any(|alt| inside(alt) == 0)
}

fn fits(defined: &HashMap<&str, Vec<Alt<'_>>>, members: &[&str], copies: usize) -> bool {
    let alts: usize = members.iter().map(|name| defined[name].len()).sum();
    alts.saturating_mul(copies) <= MAX_REWRITTEN
}

/// The group entered at `entry`, left-recursive: rule `{prefix}_{k}` matches the text from the
/// entry up to where the group is at its k-th member, and the entry's own name matches the text
/// from the entry to where the group is left.
fn left_recursive(
    defined: &HashMap<&str, Vec<Alt<'_>>>,
    members: &[&str],
    entry: &str,
    prefix: &str,
) -> Vec<(String, String)> {
    let at = |name: &str| members.iter().position(|member| *member == name);
    let state = |k: usize| format!("{prefix}_{k}");
    let mut reaching: Vec<Vec<String>> = vec![Vec::new(); members.len()];
    let mut leaving = Vec::new();
    if let Some(k) = at(entry) {
        reaching[k].push("\"\"".to_owned());
    }
    for (k, name) in members.iter().enumerate() {
        for alt in &defined[name] {
            match alt.tail.and_then(at) {
                Some(next) => {
                    let before = &alt.items[..alt.items.len().saturating_sub(1)];
                    reaching[next].push(sequence_lark(Some(&state(k)), before));
                }
                None => leaving.push(sequence_lark(Some(&state(k)), &alt.items)),
            }
        }
    }
    let states = reaching
        .into_iter()
        .enumerate()
        .map(|(k, alts)| (state(k), alts.join(" | ")));
    std::iter::once((lark_name(entry), leaving.join(" | ")))
        .chain(states)
        .collect()
}

/// The strongly connected components of the graph `edges` (Tarjan's algorithm, with an explicit
/// stack: a grammar may chain thousands of rules).
fn components(edges: &[Vec<usize>]) -> Vec<Vec<usize>> {
    const UNSEEN: usize = usize::MAX;
    let mut order = vec![UNSEEN; edges.len()];
    let mut low = vec![0; edges.len()];
    let mut on_stack = vec![false; edges.len()];
    let (mut stack, mut groups, mut next) = (Vec::new(), Vec::new(), 0);
    for start in 0..edges.len() {
        if order[start] != UNSEEN {
            continue;
        }
        let mut calls = vec![(start, 0)];
        (order[start], low[start], next) = (next, next, next + 1);
        stack.push(start);
        on_stack[start] = true;
        while let Some(top) = calls.len().checked_sub(1) {
            let (node, edge) = calls[top];
            if let Some(&to) = edges[node].get(edge) {
                calls[top].1 += 1;
                if order[to] == UNSEEN {
                    (order[to], low[to], next) = (next, next, next + 1);
                    stack.push(to);
                    on_stack[to] = true;
                    calls.push((to, 0));
                } else if on_stack[to] {
                    low[node] = low[node].min(order[to]);
                }
                continue;
            }
            calls.pop();
            if let Some(&(parent, _)) = calls.last() {
                low[parent] = low[parent].min(low[node]);
            }
            if low[node] == order[node] {
                let mut group = Vec::new();
                while let Some(member) = stack.pop() {
                    on_stack[member] = false;
                    group.push(member);
                    if member == node {
                        break;
                    }
                }
                group.sort_unstable();
                groups.push(group);
            }
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::super::to_lark;
    use super::*;

    #[test]
    fn components_are_found_without_recursion() {
        let edges = vec![vec![1], vec![2], vec![0, 3], vec![3], vec![]];
        let mut groups = components(&edges);
        groups.sort();
        assert_eq!(groups, vec![vec![0, 1, 2], vec![3], vec![4]]);
        let chain: Vec<Vec<usize>> = (0..100_000)
            .map(|i| if i + 1 < 100_000 { vec![i + 1] } else { vec![] })
            .collect();
        assert_eq!(components(&chain).len(), 100_000);
    }

    #[test]
    fn a_right_linear_group_becomes_left_recursive_from_each_entry() {
        let lark = to_lark("root ::= u \"!\"\nu ::= \"\" | [a] u | \"b\" v\nv ::= \"c\" u", "root").unwrap();
        assert_eq!(
            lark,
            "start: g_root\ng_root: g_u \"!\"\ng_u: l0_0_0\nl0_0_0: \"\" | l0_0_0 /[\\x{61}-\\x{61}]/ | l0_0_1 \"c\"\n\
             l0_0_1: l0_0_0 \"b\"\n"
        );
    }

    #[test]
    fn recursion_that_is_not_at_the_end_stays() {
        let grammar = "root ::= e\ne ::= \"[\" e \"]\" | \"x\"";
        assert_eq!(
            to_lark(grammar, "root").unwrap(),
            "start: g_root\ng_e: \"[\" g_e \"]\" | \"x\"\ng_root: g_e\n"
        );
    }
}
