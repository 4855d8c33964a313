// tests/engine/queue_test_util.h: every helper for tests that run real
// processes against one WorkQueue, one header per job:
//
//  * test_basics.h: errno and error texts, substring checks, clocks, busy
//    waits, numbers and seeds from the environment.
//  * temp_dir.h: TempDir, a private directory with generated (sparse) work
//    files.
//  * queue_fixture.h: UniqueQueueName / QueueGuard (names no other test or run
//    can collide with, force-removed at the end of a test), the QueueTest
//    fixture, FailsWith, CheckItem (the invariants every handed-out WorkItem
//    must satisfy), Drain, ItemTable, and the cleaner of leftover segments.
//  * coverage.h: ExactlyOnce / Coverage: per-(epoch, item) ack counts, or
//    acked byte ranges that must tile each item when tails may be split.
//  * children.h: Children, forked children that report through anonymous
//    shared memory, which the parent can still read after a child was
//    SIGKILLed (every wait has a deadline); SharedBlob; StartGate.
//  * worker.h: RunWorker, the body of a worker child (take, optionally Claim
//    chunks like tailcut's Reader, ack / give back), logging "about to ack"
//    before each Ack and "acked" after it; CountAcks, AddAckedBeforeSave.
#ifndef TAILCUT_TESTS_ENGINE_QUEUE_TEST_UTIL_H_
#define TAILCUT_TESTS_ENGINE_QUEUE_TEST_UTIL_H_

#include "tests/engine/children.h"
#include "tests/engine/coverage.h"
#include "tests/engine/queue_fixture.h"
#include "tests/engine/temp_dir.h"
#include "tests/engine/test_basics.h"
#include "tests/engine/worker.h"

#endif  // TAILCUT_TESTS_ENGINE_QUEUE_TEST_UTIL_H_
