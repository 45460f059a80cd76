/* A delay line between pairs of network interfaces, in one process: every frame that arrives
 * on one interface of a pair is sent out of the other after that direction's one-way delay,
 * plus uniform jitter that never reorders (a frame leaves no earlier than the one before it),
 * unless a seeded draw drops it (random loss). What mahimahi's mm-delay and mm-loss do, on
 * Ethernet frames (AF_PACKET), so that it can sit anywhere in a bridged emulation: netem is
 * not in every kernel.
 *
 *   delayline [--seed N] IF_A,IF_B,DELAY_AB,DELAY_BA,JITTER_AB,JITTER_BA,LOSS_AB,LOSS_BA ...
 *
 * Delays and jitters in seconds, losses as fractions. Frames keep their virtio-net header
 * (PACKET_VNET_HDR): checksum offload and GSO super-frames pass as they came, as on a veth.
 * SIGUSR1 prints one JSON line of counts per direction; SIGTERM prints it and exits. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_DIRECTIONS 256
#define FRAME_MAX 65600 /* a GSO super-frame (64 KiB) with its Ethernet and vnet headers */
#define BATCH 64        /* frames read from one socket before the others get a turn */

struct frame {
    struct frame *next;
    uint64_t due;  /* ns, CLOCK_MONOTONIC */
    uint32_t len;
    unsigned char data[];
};

struct direction {
    char name[64];
    uint64_t rng[4];          /* its own draws: one direction's losses do not move another's */
    int in, out;              /* sockets: frames arrive on `in`, leave through `out` */
    uint64_t delay, jitter;   /* ns */
    double loss;
    uint64_t last_due;
    struct frame *head, *tail;
    uint64_t frames, bytes, lost, send_errors, queued, max_queued;
};

static struct direction dirs[MAX_DIRECTIONS];
static int n_dirs;
static volatile sig_atomic_t want_counts, want_exit;
static uint64_t seed_value;

static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

static uint64_t next_random(uint64_t *s) { /* xoshiro256** */
    uint64_t result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0]; s[3] ^= s[1]; s[1] ^= s[2]; s[0] ^= s[3]; s[2] ^= t; s[3] = rotl(s[3], 45);
    return result;
}

static double uniform(uint64_t *s) { return (next_random(s) >> 11) * 0x1.0p-53; }

static void seed(uint64_t *s, uint64_t value) { /* splitmix64 */
    for (int i = 0; i < 4; i++) {
        uint64_t z = (value += 0x9e3779b97f4a7c15ULL);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
        s[i] = z ^ (z >> 31);
    }
}

static uint64_t now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

static void die(const char *what, const char *detail) {
    fprintf(stderr, "delayline: %s: %s\n", what, detail);
    exit(2);
}

static int open_socket(const char *interface) {
    int fd = socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK, htons(ETH_P_ALL));
    if (fd < 0) die("socket(AF_PACKET)", strerror(errno));
    int one = 1, size = 64 << 20;
    if (setsockopt(fd, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one))
        die("PACKET_VNET_HDR", strerror(errno));
    if (setsockopt(fd, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one))
        die("PACKET_IGNORE_OUTGOING", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size);
    setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size);
    struct sockaddr_ll address = {0};
    address.sll_family = AF_PACKET;
    address.sll_protocol = htons(ETH_P_ALL);
    address.sll_ifindex = (int)if_nametoindex(interface);
    if (!address.sll_ifindex) die(interface, "no such interface");
    if (bind(fd, (struct sockaddr *)&address, sizeof address)) die(interface, strerror(errno));
    struct packet_mreq promiscuous = {.mr_ifindex = address.sll_ifindex,
                                      .mr_type = PACKET_MR_PROMISC};
    if (setsockopt(fd, SOL_PACKET, PACKET_ADD_MEMBERSHIP, &promiscuous, sizeof promiscuous))
        die("PACKET_MR_PROMISC", strerror(errno));
    return fd;
}

static double number(const char *text, const char *what) {
    char *end;
    double value = strtod(text, &end);
    if (end == text || *end || value < 0) die(what, "expected a number at least 0");
    return value;
}

static void add_pair(const char *given) {
    char spec[512];
    snprintf(spec, sizeof spec, "%s", given);
    char *part[8], *save = NULL, *token = strtok_r(spec, ",", &save);
    int n = 0;
    for (; token && n < 8; token = strtok_r(NULL, ",", &save)) part[n++] = token;
    if (n != 8 || token) die(given, "expected IF_A,IF_B,DELAY_AB,DELAY_BA,JITTER_AB,JITTER_BA,"
                                   "LOSS_AB,LOSS_BA");
    if (n_dirs + 2 > MAX_DIRECTIONS) die(given, "too many pairs");
    for (int k = 0; k < 2; k++) {
        struct direction *d = &dirs[n_dirs + k];
        memset(d, 0, sizeof *d);
        snprintf(d->name, sizeof d->name, "%s>%s", part[k], part[1 - k]);
        d->delay = (uint64_t)(number(part[2 + k], "delay") * 1e9);
        d->jitter = (uint64_t)(number(part[4 + k], "jitter") * 1e9);
        d->loss = number(part[6 + k], "loss");
        if (d->jitter > d->delay) die(d->name, "jitter exceeds the delay");
        if (d->loss > 1) die(d->name, "loss is a fraction, at most 1");
        seed(d->rng, seed_value * 1000003ULL + (uint64_t)(n_dirs + k));
    }
    int a = open_socket(part[0]), b = open_socket(part[1]);
    dirs[n_dirs].in = dirs[n_dirs + 1].out = a;
    dirs[n_dirs].out = dirs[n_dirs + 1].in = b;
    n_dirs += 2;
}

static void print_counts(void) {
    printf("{");
    for (int i = 0; i < n_dirs; i++) {
        struct direction *d = &dirs[i];
        printf("%s\"%s\": {\"frames\": %llu, \"bytes\": %llu, \"lost\": %llu, "
               "\"send_errors\": %llu, \"max_queued\": %llu}", i ? ", " : "", d->name,
               (unsigned long long)d->frames, (unsigned long long)d->bytes,
               (unsigned long long)d->lost, (unsigned long long)d->send_errors,
               (unsigned long long)d->max_queued);
    }
    printf("}\n");
    fflush(stdout);
}

static void on_signal(int signal) {
    if (signal == SIGUSR1) want_counts = 1; else want_exit = 1;
}

/* Read what arrived on d's input (a batch at most), stamp each frame with its departure. */
static void receive(struct direction *d, unsigned char *buffer) {
    for (int i = 0; i < BATCH; i++) {
        ssize_t len = recv(d->in, buffer, FRAME_MAX, MSG_TRUNC);
        if (len < 0) {
            if (errno != EAGAIN && errno != EINTR) die(d->name, strerror(errno));
            return;
        }
        d->frames++;
        d->bytes += (uint64_t)len;
        if (len > FRAME_MAX) die(d->name, "a frame larger than the buffer");
        if (d->loss > 0 && uniform(d->rng) < d->loss) {
            d->lost++;
            continue;
        }
        uint64_t due = now_ns() + d->delay;
        if (d->jitter) due = due - d->jitter + (uint64_t)(uniform(d->rng) * 2.0 * (double)d->jitter);
        if (due < d->last_due) due = d->last_due; /* never reorder */
        d->last_due = due;
        struct frame *f = malloc(sizeof *f + (size_t)len);
        if (!f) die(d->name, "out of memory");
        f->next = NULL;
        f->due = due;
        f->len = (uint32_t)len;
        memcpy(f->data, buffer, (size_t)len);
        if (d->tail) d->tail->next = f; else d->head = f;
        d->tail = f;
        if (++d->queued > d->max_queued) d->max_queued = d->queued;
    }
}

/* Send every frame of d that is due; the time the next one is due (UINT64_MAX: none). */
static uint64_t release(struct direction *d, uint64_t now) {
    while (d->head && d->head->due <= now) {
        struct frame *f = d->head;
        if (send(d->out, f->data, f->len, 0) < 0) {
            if (errno == EAGAIN) return now + 20000; /* the socket's buffer is full: soon */
            d->send_errors++; /* the outgoing queue dropped it (ENOBUFS), as a port would */
        }
        d->head = f->next;
        if (!d->head) d->tail = NULL;
        d->queued--;
        free(f);
    }
    return d->head ? d->head->due : UINT64_MAX;
}

int main(int argc, char **argv) {
    int first = 1;
    if (argc > 2 && !strcmp(argv[1], "--seed")) {
        seed_value = strtoull(argv[2], NULL, 10);
        first = 3;
    }
    if (first >= argc) die("usage", "delayline [--seed N] IF_A,IF_B,DELAY_AB,DELAY_BA,"
                                    "JITTER_AB,JITTER_BA,LOSS_AB,LOSS_BA ...");
    for (int i = first; i < argc; i++) add_pair(argv[i]);
    prctl(PR_SET_TIMERSLACK, 1UL);
    struct sched_param priority = {.sched_priority = 10};
    sched_setscheduler(0, SCHED_FIFO, &priority); /* where allowed: a late wake-up is delay */
    struct sigaction action = {0};
    action.sa_handler = on_signal;
    sigaction(SIGUSR1, &action, NULL);
    sigaction(SIGTERM, &action, NULL);
    sigaction(SIGINT, &action, NULL);
    /* The signals are taken only inside ppoll: one that comes between a check of the flags
       and the wait is not lost (the wait returns at once with EINTR). */
    sigset_t blocked, during_wait;
    sigemptyset(&blocked);
    sigaddset(&blocked, SIGUSR1);
    sigaddset(&blocked, SIGTERM);
    sigaddset(&blocked, SIGINT);
    sigprocmask(SIG_BLOCK, &blocked, &during_wait);
    unsigned char *buffer = malloc(FRAME_MAX);
    struct pollfd polls[MAX_DIRECTIONS];
    for (int i = 0; i < n_dirs; i++) polls[i] = (struct pollfd){.fd = dirs[i].in, .events = POLLIN};
    printf("ready\n");
    fflush(stdout);
    while (!want_exit) {
        uint64_t now = now_ns(), next = UINT64_MAX;
        for (int i = 0; i < n_dirs; i++) {
            uint64_t due = release(&dirs[i], now);
            if (due < next) next = due;
        }
        struct timespec wait, *timeout = NULL;
        if (next != UINT64_MAX) {
            uint64_t left = next > now ? next - now : 0;
            wait.tv_sec = (time_t)(left / 1000000000ULL);
            wait.tv_nsec = (long)(left % 1000000000ULL);
            timeout = &wait;
        }
        int ready = ppoll(polls, (nfds_t)n_dirs, timeout, &during_wait);
        if (ready < 0 && errno != EINTR) die("ppoll", strerror(errno));
        for (int i = 0; ready > 0 && i < n_dirs; i++) {
            if (polls[i].revents & (POLLERR | POLLHUP | POLLNVAL))
                die(dirs[i].name, "its interface failed (gone or down)");
            if (polls[i].revents & POLLIN) receive(&dirs[i], buffer);
        }
        if (want_counts) {
            want_counts = 0;
            print_counts();
        }
    }
    print_counts();
    return 0;
}
