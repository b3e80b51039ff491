//! Macros that write the methods several of the crate's types share.

/// Writes a method that posts (or accepts) a request on one region or on
/// a gather list, with the signature every such method of the API has.
///
/// `fn name(receiver, leading params) posts (region, range, context) { body }`
/// takes `range` of `region` (a [`MemoryRegion`](crate::MemoryRegion))
/// and the `context` its completion carries, and is refused with a
/// [`PostError`](crate::PostError);
/// `fn name(receiver, leading params) posts gather (parts, context) { body }`
/// takes a gather list (regions and ranges, in order) and is refused with
/// a [`GatherError`](crate::GatherError). Either followed by `for R`
/// takes regions of type `R` and is refused with the error and what it
/// was given, as the data path's inner layers are. The parameter names
/// are the caller's, so the body uses them as its own.
macro_rules! posting_fn {
    (
        $(#[$attr:meta])*
        $vis:vis fn $name:ident($($head:tt)+)
            posts ($region:ident, $range:ident, $context:ident) for $r:ty $body:block
    ) => {
        $(#[$attr])*
        $vis fn $name(
            $($head)+,
            $region: $r,
            $range: ::std::ops::Range<usize>,
            $context: u64,
        ) -> ::std::result::Result<(), ($crate::Error, $r)> $body
    };
    (
        $(#[$attr:meta])*
        $vis:vis fn $name:ident($($head:tt)+)
            posts gather ($parts:ident, $context:ident) for $r:ty $body:block
    ) => {
        $(#[$attr])*
        #[allow(clippy::type_complexity)]
        $vis fn $name(
            $($head)+,
            $parts: ::std::vec::Vec<($r, ::std::ops::Range<usize>)>,
            $context: u64,
        ) -> ::std::result::Result<(), ($crate::Error, ::std::vec::Vec<($r, ::std::ops::Range<usize>)>)>
            $body
    };
    (
        $(#[$attr:meta])*
        $vis:vis fn $name:ident($($head:tt)+)
            posts ($region:ident, $range:ident, $context:ident) $body:block
    ) => {
        $(#[$attr])*
        $vis fn $name(
            $($head)+,
            $region: $crate::MemoryRegion,
            $range: ::std::ops::Range<usize>,
            $context: u64,
        ) -> ::std::result::Result<(), $crate::PostError> $body
    };
    (
        $(#[$attr:meta])*
        $vis:vis fn $name:ident($($head:tt)+)
            posts gather ($parts:ident, $context:ident) $body:block
    ) => {
        $(#[$attr])*
        $vis fn $name(
            $($head)+,
            $parts: ::std::vec::Vec<($crate::MemoryRegion, ::std::ops::Range<usize>)>,
            $context: u64,
        ) -> ::std::result::Result<(), $crate::GatherError> $body
    };
}
pub(crate) use posting_fn;

/// Writes the methods a batch of send-side requests ([`PostBatch`],
/// [`ScheduledBatch`]) has over its inner batch (`self.inner`, with
/// `push`, `push_gather`, `len`, `submit` and `cancel`), each with the
/// documentation given for it.
///
/// [`PostBatch`]: crate::PostBatch
/// [`ScheduledBatch`]: crate::ScheduledBatch
macro_rules! batch_methods {
    (
        $(#[$send:meta])* post_send;
        $(#[$gather:meta])* post_send_gather;
        $(#[$submit:meta])* submit;
        $(#[$cancel:meta])* cancel;
    ) => {
        $crate::macros::posting_fn! {
            $(#[$send])*
            pub fn post_send(&mut self, op: $crate::SendOp) posts (region, range, context) {
                self.inner
                    .push(op, region, range, context)
                    .map_err($crate::PostError::new)
            }
        }

        $crate::macros::posting_fn! {
            $(#[$gather])*
            pub fn post_send_gather(&mut self, op: $crate::SendOp) posts gather (parts, context) {
                self.inner
                    .push_gather(op, parts, context)
                    .map_err($crate::GatherError::new)
            }
        }

        /// Requests in the batch.
        pub fn len(&self) -> usize {
            self.inner.len()
        }

        /// Whether the batch has no request.
        pub fn is_empty(&self) -> bool {
            self.inner.len() == 0
        }

        $(#[$submit])*
        pub fn submit(self) -> Result<(), $crate::BatchError> {
            self.inner.submit().map_err($crate::BatchError::new)
        }

        $(#[$cancel])*
        pub fn cancel(self) -> Vec<(u64, $crate::MemoryRegion)> {
            self.inner.cancel()
        }
    };
}
pub(crate) use batch_methods;
