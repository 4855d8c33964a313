// tests/io/item_holder.h: another process that holds one item of a queue, so
// that a Reader in the test process meets the end of the data while a live
// process still has an open item. The test then lets it give the item back,
// or kills it (SIGKILL), and the item comes back to the queue.
#ifndef TAILCUT_TESTS_IO_ITEM_HOLDER_H_
#define TAILCUT_TESTS_IO_ITEM_HOLDER_H_

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "tailcut/work_queue.h"

namespace tailcut {

class ItemHolder {
 public:
  // Forks a child that attaches to the queue of `options`, takes one item
  // and waits. Returns once the child holds it (ok() says whether it does).
  explicit ItemHolder(const WorkQueueOptions& options) {
    int to_child[2], from_child[2];
    if (pipe(to_child) != 0 || pipe(from_child) != 0) return;
    fflush(nullptr);
    pid_ = fork();
    if (pid_ == 0) {
      close(to_child[1]);
      close(from_child[0]);
      char answer = 'x';
      try {
        auto queue = WorkQueue::Open(options);
        WorkItem item;
        if (queue->TryTake(&item) == TakeStatus::kOk) answer = 'h';
        if (write(from_child[1], &answer, 1) != 1) _exit(2);
        char command = 0;
        if (read(to_child[0], &command, 1) != 1) _exit(3);
        if (answer == 'h' && queue->GiveBack(item) != ItemStatus::kOk) _exit(4);
        queue->Close();
      } catch (...) {
        if (answer == 'x' && write(from_child[1], &answer, 1) != 1) _exit(5);
        _exit(6);
      }
      _exit(0);
    }
    close(to_child[0]);
    close(from_child[1]);
    to_child_ = to_child[1];
    char answer = 0;
    ok_ = pid_ > 0 && read(from_child[0], &answer, 1) == 1 && answer == 'h';
    close(from_child[0]);
  }
  ~ItemHolder() {
    if (pid_ > 0 && !reaped_) Kill();
    if (to_child_ >= 0) close(to_child_);
  }
  ItemHolder(const ItemHolder&) = delete;
  ItemHolder& operator=(const ItemHolder&) = delete;

  bool ok() const { return ok_; }
  // The child gives its item back and exits; returns its exit code.
  int GiveBack() {
    char command = 'g';
    if (write(to_child_, &command, 1) != 1) return -1;
    return Reap();
  }
  // SIGKILL: the item comes back when a live process finds the child dead.
  void Kill() {
    kill(pid_, SIGKILL);
    Reap();
  }

 private:
  int Reap() {
    int status = 0;
    waitpid(pid_, &status, 0);
    reaped_ = true;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  pid_t pid_ = -1;
  int to_child_ = -1;
  bool ok_ = false;
  bool reaped_ = false;
};

}  // namespace tailcut

#endif  // TAILCUT_TESTS_IO_ITEM_HOLDER_H_
