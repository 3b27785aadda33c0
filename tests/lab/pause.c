/* The lab's pod sandbox ("pause") process: holds the pod's namespaces, reaps orphans, exits on INT/TERM.
 * registry.k8s.io/pause cannot be pulled here; this one is built from source (tests/lab/pause.py). */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void reap(int signum) {
    (void)signum;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

static void quit(int signum) {
    (void)signum;
    _exit(0);
}

int main(void) {
    signal(SIGINT, quit);
    signal(SIGTERM, quit);
    signal(SIGCHLD, reap);
    for (;;) {
        pause();
    }
}
