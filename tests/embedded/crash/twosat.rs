//! A 2-SAT solver (strongly connected components of the implication graph, Kosaraju).
//!
//! The crash checker asks whether some set of surviving transactions explains what the store
//! holds after a crash; every rule it knows is a clause of at most two literals.

/// A literal: a variable or its negation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Lit(usize);

impl Lit {
    /// "`var` is true".
    pub(crate) fn yes(var: usize) -> Lit {
        Lit(2 * var)
    }

    /// "`var` is false".
    pub(crate) fn no(var: usize) -> Lit {
        Lit(2 * var + 1)
    }

    fn not(self) -> Lit {
        Lit(self.0 ^ 1)
    }
}

/// Clauses over variables `0..vars()`.
#[derive(Debug, Default)]
pub(crate) struct TwoSat {
    /// Implication graph: node `2v` is "v", node `2v + 1` is "not v".
    edges: Vec<Vec<usize>>,
}

impl TwoSat {
    /// A new variable.
    pub(crate) fn var(&mut self) -> usize {
        self.edges.push(Vec::new());
        self.edges.push(Vec::new());
        self.edges.len() / 2 - 1
    }

    /// `a or b`.
    pub(crate) fn either(&mut self, a: Lit, b: Lit) {
        self.edges[a.not().0].push(b.0);
        self.edges[b.not().0].push(a.0);
    }

    /// `a implies b`.
    pub(crate) fn implies(&mut self, a: Lit, b: Lit) {
        self.either(a.not(), b);
    }

    /// `a` must hold.
    pub(crate) fn require(&mut self, a: Lit) {
        self.either(a, a);
    }

    /// A satisfying assignment, or `None` if there is none.
    pub(crate) fn solve(&self) -> Option<Vec<bool>> {
        let n = self.edges.len();
        // First pass: nodes by increasing finish time.
        let mut seen = vec![false; n];
        let mut order = Vec::with_capacity(n);
        for start in 0..n {
            if seen[start] {
                continue;
            }
            seen[start] = true;
            let mut stack = vec![(start, 0)];
            while let Some(&(node, next)) = stack.last() {
                if let Some(&to) = self.edges[node].get(next) {
                    let top = stack.len() - 1;
                    stack[top].1 += 1;
                    if !seen[to] {
                        seen[to] = true;
                        stack.push((to, 0));
                    }
                } else {
                    order.push(node);
                    stack.pop();
                }
            }
        }
        // Second pass on the reversed graph: components in topological order.
        let mut reversed = vec![Vec::new(); n];
        for (from, tos) in self.edges.iter().enumerate() {
            for &to in tos {
                reversed[to].push(from);
            }
        }
        let mut component = vec![usize::MAX; n];
        let mut next_component = 0;
        for &start in order.iter().rev() {
            if component[start] != usize::MAX {
                continue;
            }
            component[start] = next_component;
            let mut stack = vec![start];
            while let Some(node) = stack.pop() {
                for &from in &reversed[node] {
                    if component[from] == usize::MAX {
                        component[from] = next_component;
                        stack.push(from);
                    }
                }
            }
            next_component += 1;
        }
        (0..n / 2)
            .map(|v| {
                let (yes, no) = (component[2 * v], component[2 * v + 1]);
                (yes != no).then_some(yes > no)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_assignments_and_contradictions() {
        let mut sat = TwoSat::default();
        let (x, y, z) = (sat.var(), sat.var(), sat.var());
        sat.implies(Lit::yes(x), Lit::yes(y));
        sat.implies(Lit::yes(y), Lit::no(z));
        sat.require(Lit::yes(x));
        let model = sat.solve().expect("satisfiable");
        assert_eq!((model[x], model[y], model[z]), (true, true, false));

        sat.either(Lit::yes(z), Lit::no(y));
        assert_eq!(sat.solve(), None);
    }
}
