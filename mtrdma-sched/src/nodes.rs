//! The node arena the DRR schedulers keep their tenants' queues in.

use crate::descriptor::{Descriptor, Grant};

/// No node: the end of a list, or an empty queue.
pub(crate) const NIL: u32 = u32::MAX;

/// One descriptor in the node arena, linked to the next one of the same
/// tenant and class (or, while free, to the next free node).
#[derive(Debug)]
pub(crate) struct Node<H> {
    descriptor: Option<Descriptor<H>>,
    next: u32,
}

/// The descriptors of every tenant in one arena. Each tenant's FIFO of one
/// class is a linked list of node indices, so queueing allocates nothing
/// once the arena has grown to the peak backlog, and a tenant's queue costs
/// no allocation (and no cache line) of its own. Freed nodes are reused
/// last in, first out, while their cache line is still warm.
#[derive(Debug)]
pub(crate) struct Nodes<H> {
    nodes: Vec<Node<H>>,
    /// Head of the free list.
    free: u32,
}

impl<H> Nodes<H> {
    pub(crate) fn new() -> Self {
        Nodes {
            nodes: Vec::new(),
            free: NIL,
        }
    }

    /// Stores `d` in a node of its own (linked to nothing) and returns it.
    ///
    /// Panics if 2^32 - 1 descriptors are queued already (at least 96 GiB).
    #[inline(always)]
    pub(crate) fn alloc(&mut self, d: Descriptor<H>) -> u32 {
        if let Some(node) = self.nodes.get_mut(self.free as usize) {
            let n = self.free;
            self.free = node.next;
            node.descriptor = Some(d);
            node.next = NIL;
            return n;
        }
        let n = u32::try_from(self.nodes.len())
            .ok()
            .filter(|&n| n != NIL)
            .expect("at most 2^32 - 1 descriptors queued at once");
        self.nodes.push(Node {
            descriptor: Some(d),
            next: NIL,
        });
        n
    }

    /// The descriptor in node `n`.
    #[inline(always)]
    pub(crate) fn get(&self, n: u32) -> Option<&Descriptor<H>> {
        self.nodes.get(n as usize)?.descriptor.as_ref()
    }

    /// Makes `to` follow `from` in its list.
    #[inline(always)]
    pub(crate) fn link(&mut self, from: u32, to: u32) {
        if let Some(node) = self.nodes.get_mut(from as usize) {
            node.next = to;
        }
    }

    /// Frees node `n`, returning its descriptor and the node that followed
    /// it.
    #[inline(always)]
    pub(crate) fn release(&mut self, n: u32) -> (Option<Descriptor<H>>, u32) {
        let Some(node) = self.nodes.get_mut(n as usize) else {
            return (None, NIL);
        };
        let next = std::mem::replace(&mut node.next, self.free);
        self.free = n;
        (node.descriptor.take(), next)
    }

    /// Grants the next `len` bytes of the descriptor at the head `*head` of
    /// a queue, of which `*sent` bytes were granted before. Its last piece
    /// frees the node and moves `*head` on to the one that followed it.
    #[inline(always)]
    pub(crate) fn grant_piece(
        &mut self,
        head: &mut u32,
        sent: &mut u64,
        len: u64,
    ) -> Option<Grant<H>>
    where
        H: Clone,
    {
        let offset = *sent;
        let d = self.get(*head)?;
        if offset + len != d.bytes {
            *sent += len;
            return Some(d.clone().piece(offset, len, false));
        }
        let (d, next) = self.release(*head);
        *head = next;
        *sent = 0;
        Some(d?.piece(offset, len, true))
    }
}
