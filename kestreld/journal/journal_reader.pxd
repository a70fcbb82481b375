# Cython declarations for journal_reader.py (compiled when a compiler is present; see
# kestreld/compiled.py).  Every put is offered and every get or confirm recorded here: the
# head, the tail and the cursor's offsets are C fields, the journal and the progress file
# are typed, the hot verbs are cpdef.

cimport cython

from kestreld.journal.batch cimport Batch
from kestreld.journal.progress cimport ProgressLog
from kestreld.journal.segment cimport Segment
from kestreld.journal.writer cimport WriterJournal


cdef class ReadBehind:
    cdef public Segment segment
    cdef public long long offset
    cdef public long long next_id

    cpdef loaded(self, long long id_)
    cpdef advance(self, long long offset)
    cpdef move_to(self, Segment segment)
    cpdef skip_to(self, long long next_id)


cdef class JournalReader:
    cdef public object full_name
    cdef public WriterJournal journal
    cdef public ProgressLog progress
    cdef public long long head
    cdef public set done
    cdef public set held
    cdef public long long tail
    cdef public bint dirty
    cdef public long long saved_head
    cdef public ReadBehind read_behind
    cdef public bint closed
    cdef public long long lost_items
    cdef public bint lost_track
    cdef public object on_rewrite_needed

    cpdef bint seen(self, long long id_) except -1
    cpdef read_behind_from(self, Segment segment, long long offset, long long id_)
    @cython.locals(journal=WriterJournal, progress=ProgressLog)
    cpdef Batch record(self, long long id_)
    cpdef record_removed(self, long long id_)
    @cython.locals(journal=WriterJournal, progress=ProgressLog)
    cpdef journal_drop(self, long long id_)
    cpdef hold(self, long long id_)
    @cython.locals(head=cython.longlong, done=set)
    cpdef commit(self, long long id_)
    cpdef _progress_acked(self, list ids, Batch batch)
    @cython.locals(rb=ReadBehind, journal=WriterJournal, seg=Segment, loaded=cython.longlong,
                   id_=cython.longlong)
    cpdef list read_ahead(self, long long room, bint have, long long per_item)
