// kestreld's thrift interface: the wire interface of Kestrel's thrift port
// (2229; Finagle's framed transport, binary protocol).  Field ids, types and
// defaults are the wire contract: clients generated from Kestrel's own IDL
// talk to kestreld unchanged.  docs/protocol.md says where kestreld differs.

namespace java net.lag.kestrel.thrift
namespace py kestrel

// One fetched item.
struct Item {
  // The item's bytes.
  1: binary data

  // The id to confirm or abort it by (server-wide); 0 when the get confirmed it.
  2: i64 id
}

// A queue's counters, and its head item if it has one.
struct QueueInfo {
  // The item at the head, not removed.
  1: optional binary head_item

  // Items waiting in the queue (open reads not counted).
  2: i64 items

  // Bytes of the waiting items.
  3: i64 bytes

  // Bytes of journal on disk.
  4: i64 journal_bytes

  // Age in milliseconds of the last item fetched.
  5: i64 age

  // Clients waiting for an item.
  6: i32 waiters

  // Items fetched and neither confirmed nor aborted.
  7: i32 open_transactions
}

enum Status {
  // Never sent by kestreld, which always has a status.
  NOT_CONFIGURED = 0,

  // Neither reads nor writes are served.
  QUIESCENT = 1,

  // Reads are served, writes are refused.
  READ_ONLY = 2,

  // Reads and writes are served.
  UP = 3,
}

service Kestrel {
  // Add items to a queue (created if missing), in order; stops at the first
  // item the queue refuses.  Returns how many were stored, after they are on
  // disk.  expiration_msec > 0: each item expires that long from now.
  i32 put(1: string queue_name, 2: list<binary> items, 3: i32 expiration_msec = 0)

  // Fetch up to max_items items.  timeout_msec > 0: wait until max_items were
  // fetched or the time ran out; 0: only the items there at once.
  // auto_abort_msec = 0: the items are confirmed as they are returned (id 0);
  // > 0: they stay open under their id, and go back to the head of the queue
  // unless confirmed within auto_abort_msec.
  list<Item> get(1: string queue_name, 2: i32 max_items, 3: i32 timeout_msec = 0, 4: i32 auto_abort_msec = 0)

  // Confirm open items by id; returns how many of the ids were open.
  i32 confirm(1: string queue_name, 2: set<i64> ids)

  // Give open items back to the head of their queue; returns how many were open.
  i32 abort(1: string queue_name, 2: set<i64> ids)

  // The queue's counters and head item; nothing is removed.
  QueueInfo peek(1: string queue_name)

  // Drop every waiting item of one queue.
  void flush_queue(1: string queue_name)

  // Drop every waiting item of every queue.
  void flush_all_queues()

  // Delete a queue and its journal.
  void delete_queue(1: string queue_name)

  // The server's status.
  Status current_status()

  // Change the server's status (kept across restarts).
  void set_status(1: Status status)

  // The server's version.
  string get_version()
}
