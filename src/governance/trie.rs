//! A persistent map from `u64` to `V` (a hash array mapped trie, 32 ways per level): every
//! version is immutable and shares all but the changed path with the version it came from, so a
//! key directory change costs O(log n) — one new node per level (at most 32 pointers copied
//! each) — instead of a copy of the whole key list, and a reader holding an older version keeps
//! it whole.
//!
//! Used by `keyring` twice: the keys by slot (dense keys 0..n, depth ⌈log₃₂ n⌉: 3 levels at 30k
//! keys) and the secret digests by a seeded hash. `diff` lists what changed between two versions
//! by walking only the nodes that are not shared (pointer equality), which is how each shard
//! applies a new directory generation in O(changes × log n).
//!
//! Levels consume the key's bits from the lowest, 5 at a time; a leaf sits at the first level
//! where no other key shares its prefix (so lookups of a small map stop early). Two different
//! keys differ in some bit below 64, so the depth is at most 13.
//!
//! Owns: `Trie`. Must not: hold anything but immutable nodes (no interior mutability: a version
//! is a value), or panic on any key.

use std::sync::Arc;

const BITS: u32 = 5;
const MASK: u64 = (1 << BITS) - 1;

/// One version of the map. `clone` is O(1) (it shares everything).
pub struct Trie<V> {
    root: Option<Arc<Node<V>>>,
    len: usize,
}

enum Node<V> {
    Leaf(u64, V),
    /// Which of the 32 digits have a child, and the children in digit order.
    Branch(u32, Box<[Arc<Node<V>>]>),
}

impl<V> Clone for Trie<V> {
    fn clone(&self) -> Self {
        Trie {
            root: self.root.clone(),
            len: self.len,
        }
    }
}

impl<V> Default for Trie<V> {
    fn default() -> Self {
        Trie { root: None, len: 0 }
    }
}

impl<V> std::fmt::Debug for Trie<V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Trie({} entries)", self.len)
    }
}

/// The digit of `key` at level `shift` (0 past the 64th bit).
fn digit(key: u64, shift: u32) -> u32 {
    (key.checked_shr(shift).unwrap_or(0) & MASK) as u32
}

/// Where the child of `bit` sits among a branch's children.
fn pos(map: u32, bit: u32) -> usize {
    (map & bit.wrapping_sub(1)).count_ones() as usize
}

/// The child of `bit` in a branch, if there is one.
fn child<V>(map: u32, kids: &[Arc<Node<V>>], bit: u32) -> Option<&Arc<Node<V>>> {
    if map & bit == 0 {
        return None;
    }
    kids.get(pos(map, bit))
}

impl<V> Trie<V> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value of `key`: one step per level (a bit test, a popcount, a pointer).
    #[inline]
    pub fn get(&self, key: u64) -> Option<&V> {
        let mut node = self.root.as_deref()?;
        let mut shift = 0;
        loop {
            match node {
                Node::Leaf(k, v) => return (*k == key).then_some(v),
                Node::Branch(map, kids) => {
                    node = child(*map, kids, 1 << digit(key, shift))?;
                    shift += BITS;
                }
            }
        }
    }

    /// A new version with `key` set to `value` (this one is unchanged).
    pub fn insert(&self, key: u64, value: V) -> Trie<V> {
        let (root, added) = insert(self.root.as_ref(), key, value, 0);
        Trie {
            root: Some(root),
            len: self.len + usize::from(added),
        }
    }

    /// A new version without `key` (this one is unchanged).
    pub fn remove(&self, key: u64) -> Trie<V> {
        let Some(root) = &self.root else {
            return self.clone();
        };
        match remove(root, key, 0) {
            Removed::Absent => self.clone(),
            Removed::Gone(root) => Trie {
                root,
                len: self.len.saturating_sub(1),
            },
        }
    }

    /// `f(key, before, after)` for every key whose entry is not the same in `old` and `self`
    /// (set, replaced or removed since). Shared subtrees are skipped without being read, so the
    /// cost follows the number of changes, not the size of the map.
    pub fn diff<'a>(
        &'a self,
        old: &'a Trie<V>,
        f: &mut impl FnMut(u64, Option<&'a V>, Option<&'a V>),
    ) {
        diff(old.root.as_ref(), self.root.as_ref(), 0, f);
    }
}

fn insert<V>(node: Option<&Arc<Node<V>>>, key: u64, value: V, shift: u32) -> (Arc<Node<V>>, bool) {
    let Some(node) = node else {
        return (Arc::new(Node::Leaf(key, value)), true);
    };
    match &**node {
        Node::Leaf(k, _) if *k == key => (Arc::new(Node::Leaf(key, value)), false),
        Node::Leaf(k, _) => {
            // two keys share this prefix: a branch holding the old leaf, then the new key in it
            let branch = Arc::new(Node::Branch(
                1 << digit(*k, shift),
                Box::new([node.clone()]),
            ));
            insert(Some(&branch), key, value, shift)
        }
        Node::Branch(map, kids) => {
            let bit = 1 << digit(key, shift);
            let at = pos(*map, bit);
            match child(*map, kids, bit) {
                Some(kid) => {
                    let (kid, added) = insert(Some(kid), key, value, shift + BITS);
                    let mut copy = kids.clone();
                    if let Some(slot) = copy.get_mut(at) {
                        *slot = kid;
                    }
                    (Arc::new(Node::Branch(*map, copy)), added)
                }
                None => {
                    let mut copy = Vec::with_capacity(kids.len() + 1);
                    let (before, after) = kids.split_at(at.min(kids.len()));
                    copy.extend_from_slice(before);
                    copy.push(Arc::new(Node::Leaf(key, value)));
                    copy.extend_from_slice(after);
                    (Arc::new(Node::Branch(map | bit, copy.into())), true)
                }
            }
        }
    }
}

enum Removed<V> {
    Absent,
    /// The subtree without the key (`None`: nothing left).
    Gone(Option<Arc<Node<V>>>),
}

fn is_leaf<V>(n: &Node<V>) -> bool {
    matches!(n, Node::Leaf(..))
}

fn remove<V>(node: &Arc<Node<V>>, key: u64, shift: u32) -> Removed<V> {
    let (map, kids) = match &**node {
        Node::Leaf(k, _) if *k == key => return Removed::Gone(None),
        Node::Leaf(..) => return Removed::Absent,
        Node::Branch(map, kids) => (*map, kids),
    };
    let bit = 1 << digit(key, shift);
    let Some(kid) = child(map, kids, bit) else {
        return Removed::Absent;
    };
    let at = pos(map, bit);
    match remove(kid, key, shift + BITS) {
        Removed::Absent => Removed::Absent,
        // a lone leaf moves up (it is the only key with this prefix)
        Removed::Gone(Some(kid)) if kids.len() == 1 && is_leaf(&kid) => Removed::Gone(Some(kid)),
        Removed::Gone(Some(kid)) => {
            let mut copy = kids.clone();
            if let Some(slot) = copy.get_mut(at) {
                *slot = kid;
            }
            Removed::Gone(Some(Arc::new(Node::Branch(map, copy))))
        }
        Removed::Gone(None) => {
            let rest: Vec<Arc<Node<V>>> = kids
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != at)
                .map(|(_, k)| k.clone())
                .collect();
            match rest.as_slice() {
                [] => Removed::Gone(None),
                [only] if is_leaf(only) => Removed::Gone(Some(only.clone())),
                _ => Removed::Gone(Some(Arc::new(Node::Branch(map & !bit, rest.into())))),
            }
        }
    }
}

/// Every leaf under `node`, with its node (for identity checks).
fn leaves<'a, V>(node: &'a Arc<Node<V>>, f: &mut impl FnMut(u64, &'a V, &'a Arc<Node<V>>)) {
    match &**node {
        Node::Leaf(k, v) => f(*k, v, node),
        Node::Branch(_, kids) => {
            for k in kids.iter() {
                leaves(k, f);
            }
        }
    }
}

/// The leaf of `key` under `node` (which sits at level `shift`).
fn find<V>(node: Option<&Arc<Node<V>>>, key: u64, mut shift: u32) -> Option<&Arc<Node<V>>> {
    let mut node = node?;
    loop {
        match &**node {
            Node::Leaf(k, _) => return (*k == key).then_some(node),
            Node::Branch(map, kids) => {
                node = child(*map, kids, 1 << digit(key, shift))?;
                shift += BITS;
            }
        }
    }
}

fn diff<'a, V>(
    old: Option<&'a Arc<Node<V>>>,
    new: Option<&'a Arc<Node<V>>>,
    shift: u32,
    f: &mut impl FnMut(u64, Option<&'a V>, Option<&'a V>),
) {
    match (old, new) {
        (None, None) => return,
        (Some(a), Some(b)) if Arc::ptr_eq(a, b) => return,
        (Some(a), Some(b)) => {
            if let (Node::Branch(ma, ka), Node::Branch(mb, kb)) = (&**a, &**b) {
                for d in 0..32 {
                    let bit = 1u32 << d;
                    if (ma | mb) & bit != 0 {
                        diff(child(*ma, ka, bit), child(*mb, kb, bit), shift + BITS, f);
                    }
                }
                return;
            }
        }
        _ => {}
    }
    // a leaf (or nothing) on one side: the other side holds only what changed around it
    let value = |n: &'a Arc<Node<V>>| match &**n {
        Node::Leaf(_, v) => Some(v),
        Node::Branch(..) => None,
    };
    if let Some(b) = new {
        leaves(b, &mut |k, v, leaf| match find(old, k, shift) {
            Some(o) if Arc::ptr_eq(o, leaf) => {}
            Some(o) => f(k, value(o), Some(v)),
            None => f(k, None, Some(v)),
        });
    }
    if let Some(a) = old {
        leaves(a, &mut |k, v, _| {
            if find(new, k, shift).is_none() {
                f(k, Some(v), None);
            }
        });
    }
}

#[cfg(test)]
impl<V> Trie<V> {
    /// Every entry (in trie order, not key order).
    pub fn for_each<'a>(&'a self, f: &mut impl FnMut(u64, &'a V)) {
        if let Some(r) = &self.root {
            leaves(r, &mut |k, v, _| f(k, v));
        }
    }

    /// Nodes of `self` that are not nodes of `old` (what a change allocated).
    pub fn fresh_nodes(&self, old: &Trie<V>) -> usize {
        fn all<V>(n: &Arc<Node<V>>, out: &mut std::collections::HashSet<*const Node<V>>) {
            out.insert(Arc::as_ptr(n));
            if let Node::Branch(_, kids) = &**n {
                kids.iter().for_each(|k| all(k, out));
            }
        }
        fn count<V>(n: &Arc<Node<V>>, seen: &std::collections::HashSet<*const Node<V>>) -> usize {
            if seen.contains(&Arc::as_ptr(n)) {
                return 0;
            }
            1 + match &**n {
                Node::Branch(_, kids) => kids.iter().map(|k| count(k, seen)).sum(),
                Node::Leaf(..) => 0,
            }
        }
        let mut seen = std::collections::HashSet::new();
        if let Some(r) = &old.root {
            all(r, &mut seen);
        }
        self.root.as_ref().map_or(0, |r| count(r, &seen))
    }

    /// Levels on the way to the deepest leaf.
    pub fn depth(&self) -> usize {
        fn d<V>(n: &Node<V>) -> usize {
            match n {
                Node::Leaf(..) => 1,
                Node::Branch(_, kids) => 1 + kids.iter().map(|k| d(k)).max().unwrap_or(0),
            }
        }
        self.root.as_deref().map_or(0, d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    /// A small deterministic generator (xorshift), so failures replay.
    fn rng(seed: &mut u64) -> u64 {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *seed
    }

    fn changes(new: &Trie<u64>, old: &Trie<u64>) -> BTreeMap<u64, (Option<u64>, Option<u64>)> {
        let mut out = BTreeMap::new();
        new.diff(old, &mut |k, a, b| {
            assert!(
                out.insert(k, (a.copied(), b.copied())).is_none(),
                "key {k} twice"
            );
        });
        out
    }

    #[test]
    fn matches_a_btreemap_through_random_inserts_and_removes() {
        let mut seed = 0x9e37_79b9_7f4a_7c15;
        let mut model = BTreeMap::new();
        let mut t = Trie::default();
        for step in 0..20_000u64 {
            let r = rng(&mut seed);
            // small key space (collisions of prefixes, removals that hit) and a few huge keys
            let key = match r % 7 {
                0 => r,
                1 => u64::MAX - (r >> 60),
                _ => (r >> 8) % 3_000,
            };
            let before = t.clone();
            if r % 3 == 0 {
                t = t.remove(key);
                model.remove(&key);
            } else {
                t = t.insert(key, step);
                model.insert(key, step);
            }
            assert_eq!(t.len(), model.len());
            // the diff of one step names that key only, with its value before and after
            let d = changes(&t, &before);
            let was = before.get(key).copied();
            let want: BTreeMap<_, _> = match (r % 3 == 0, was) {
                (true, None) => BTreeMap::new(),
                (true, Some(v)) => [(key, (Some(v), None))].into(),
                (false, _) => [(key, (was, Some(step)))].into(),
            };
            assert_eq!(d, want, "step {step}");
        }
        for (k, v) in &model {
            assert_eq!(t.get(*k), Some(v));
        }
        assert_eq!(t.get(1 << 40), model.get(&(1 << 40)));
        let mut n = 0;
        t.for_each(&mut |k, v| {
            assert_eq!(model.get(&k), Some(v));
            n += 1;
        });
        assert_eq!(n, model.len());
        // removing everything leaves an empty map
        for k in model.keys() {
            t = t.remove(*k);
        }
        assert!(t.is_empty() && t.root.is_none());
    }

    #[test]
    fn diff_across_many_versions_names_each_changed_key_once() {
        let mut t = Trie::default();
        for k in 0..5_000u64 {
            t = t.insert(k, k);
        }
        let old = t.clone();
        t = t
            .insert(7, 70)
            .insert(7, 71)
            .insert(5_000, 1)
            .remove(12)
            .insert(12, 12);
        t = t.remove(4_000).insert(1 << 50, 2);
        let d = changes(&t, &old);
        let want: BTreeMap<u64, (Option<u64>, Option<u64>)> = [
            (7, (Some(7), Some(71))),
            (12, (Some(12), Some(12))), // replaced by a new entry: named, same value
            (4_000, (Some(4_000), None)),
            (5_000, (None, Some(1))),
            (1 << 50, (None, Some(2))),
        ]
        .into_iter()
        .collect();
        assert_eq!(d, want);
        assert!(changes(&t, &t).is_empty() && changes(&old, &old).is_empty());
        // from nothing: everything
        assert_eq!(changes(&old, &Trie::default()).len(), 5_000);
        assert_eq!(changes(&Trie::default(), &old).len(), 5_000);
    }

    #[test]
    fn a_change_allocates_one_path_not_a_copy() {
        let mut t = Trie::default();
        for k in 0..30_000u64 {
            t = t.insert(k, k);
        }
        assert_eq!(
            t.depth(),
            4,
            "30k dense keys: 3 branch levels and the leaves"
        );
        for (i, next) in [
            t.insert(29_999, 0),
            t.insert(30_000, 0),
            t.insert(123, 0),
            t.remove(5),
        ]
        .iter()
        .enumerate()
        {
            let fresh = next.fresh_nodes(&t);
            assert!(fresh <= t.depth() + 1, "change {i}: {fresh} new nodes");
        }
        assert_eq!(t.fresh_nodes(&t), 0);
    }
}
