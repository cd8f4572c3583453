/* tests/disk.rs's guest program, run with vgpu-vmm --run: a dynamically linked C program
 * that calls into a stand-in guest CUDA library, prints its arguments, checks that its
 * working directory is writable, optionally sleeps, then, if a second disk is attached
 * (/dev/vdb, ext2), mounts it read-only, prints the FNV-1a 64 hash of its data.bin, tries to
 * write the disk, and exits with the code given as its first argument.
 * Usage: disk_prog CODE SLEEP_S [ARGS...] */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

int vgpu_standin(int x);

int main(int argc, char **argv) {
    char up[64] = "?";
    FILE *u = fopen("/proc/uptime", "r");
    if (u) { if (fscanf(u, "%63s", up) != 1) strcpy(up, "?"); fclose(u); }
    printf("disk_prog: first line, uptime %s s, standin(20)=%d\n", up, vgpu_standin(20));
    for (int i = 0; i < argc; i++) printf("argv[%d]=<%s>\n", i, argv[i]);
    char cwd[256];
    FILE *w = fopen("written.txt", "w");
    printf("cwd=%s writable=%d\n", getcwd(cwd, sizeof cwd) ? cwd : "?", w != NULL && fputs("x", w) >= 0);
    if (w) fclose(w);
    fflush(stdout);
    if (argc > 2 && atoi(argv[2]) > 0) {
        printf("disk_prog: sleeping %s s\n", argv[2]);
        fflush(stdout);
        sleep(atoi(argv[2]));
    }
    if (access("/dev/vdb", F_OK) == 0) {
        mkdir("mnt", 0755);
        if (mount("/dev/vdb", "mnt", "ext2", MS_RDONLY, NULL) != 0) {
            printf("disk_prog: mount /dev/vdb: %s\n", strerror(errno));
            return 100;
        }
        FILE *f = fopen("mnt/data.bin", "rb");
        if (!f) { printf("disk_prog: open data.bin: %s\n", strerror(errno)); return 101; }
        uint64_t h = 0xcbf29ce484222325ull, n = 0;
        int c;
        while ((c = getc(f)) != EOF) { h = (h ^ (uint8_t)c) * 0x100000001b3ull; n++; }
        fclose(f);
        printf("disk_prog: data.bin bytes=%llu fnv=%016llx\n", (unsigned long long)n, (unsigned long long)h);
        int fd = open("/dev/vdb", O_WRONLY);
        char zero[512] = {0};
        long wrote = fd >= 0 ? (long)write(fd, zero, sizeof zero) : -1;
        int err = errno;
        if (fd >= 0) fsync(fd);
        printf("disk_prog: write to /dev/vdb: open=%d wrote=%ld (%s)\n", fd >= 0, wrote, wrote == 512 ? "ok" : strerror(err));
    }
    fflush(stdout);
    return argc > 1 ? atoi(argv[1]) : 0;
}
