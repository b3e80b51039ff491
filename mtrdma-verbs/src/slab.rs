//! A slab: values stored under small integer keys that are reused after
//! removal. Work requests carry the key as their `wr_id`, so a completion
//! finds its buffer again in O(1).

/// Values under reusable `usize` keys.
#[derive(Debug)]
pub(crate) struct Slab<T> {
    entries: Vec<Option<T>>,
    free: Vec<usize>,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Slab {
            entries: Vec::new(),
            free: Vec::new(),
        }
    }
}

impl<T> Slab<T> {
    /// Stores `value` and returns its key.
    #[inline(always)]
    pub(crate) fn insert(&mut self, value: T) -> usize {
        match self.free.pop() {
            Some(key) => {
                self.entries[key] = Some(value);
                key
            }
            None => {
                self.entries.push(Some(value));
                self.entries.len() - 1
            }
        }
    }

    /// Takes the value under `key` out (the key becomes free).
    #[inline]
    pub(crate) fn remove(&mut self, key: usize) -> Option<T> {
        let value = self.entries.get_mut(key)?.take()?;
        self.free.push(key);
        Some(value)
    }

    /// The value under `key`.
    #[inline]
    pub(crate) fn get(&self, key: usize) -> Option<&T> {
        self.entries.get(key)?.as_ref()
    }

    /// The value under `key`, to change.
    #[inline]
    pub(crate) fn get_mut(&mut self, key: usize) -> Option<&mut T> {
        self.entries.get_mut(key)?.as_mut()
    }

    /// How many values are stored.
    pub(crate) fn len(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    /// Every stored key and value.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, &T)> + '_ {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(k, e)| e.as_ref().map(|v| (k, v)))
    }

    /// Every stored value, to change.
    pub(crate) fn values_mut(&mut self) -> impl Iterator<Item = &mut T> + '_ {
        self.entries.iter_mut().filter_map(Option::as_mut)
    }

    /// Takes out every value for which `pred` holds.
    pub(crate) fn remove_where(&mut self, mut pred: impl FnMut(&T) -> bool) -> Vec<T> {
        let mut out = Vec::new();
        for (key, entry) in self.entries.iter_mut().enumerate() {
            if entry.as_ref().is_some_and(&mut pred) {
                out.extend(entry.take());
                self.free.push(key);
            }
        }
        out
    }

    /// Takes every value out.
    pub(crate) fn drain(&mut self) -> impl Iterator<Item = T> + '_ {
        self.free.clear();
        self.entries.drain(..).flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_reused_and_values_come_back_once() {
        let mut s = Slab::default();
        let (a, b) = (s.insert("a"), s.insert("b"));
        assert_eq!(s.len(), 2);
        assert_eq!(s.remove(a), Some("a"));
        assert_eq!(s.remove(a), None, "a value comes back once");
        let c = s.insert("c");
        assert_eq!(c, a, "the freed key is reused");
        assert_eq!(s.get(b), Some(&"b"));
        *s.get_mut(c).unwrap() = "c2";
        assert_eq!(s.len(), 2);
        let mut all: Vec<_> = s.drain().collect();
        all.sort();
        assert_eq!(all, ["b", "c2"]);
        assert_eq!(s.len(), 0);
        assert_eq!(s.remove(99), None);
    }

    #[test]
    fn remove_where_takes_only_matching_values_and_frees_their_keys() {
        let mut s = Slab::default();
        let keys: Vec<usize> = (0..6).map(|i| s.insert(i)).collect();
        let mut odd = s.remove_where(|v| v % 2 == 1);
        odd.sort();
        assert_eq!(odd, [1, 3, 5]);
        assert_eq!(s.len(), 3);
        assert_eq!(s.get(keys[2]), Some(&2));
        assert_eq!(s.get(keys[3]), None);
        let k = s.insert(10);
        assert!(
            [keys[1], keys[3], keys[5]].contains(&k),
            "a freed key is reused"
        );
    }
}
