#include <hcomm/hcomm.h>
#include <stdio.h>
#define BUF_SIZE (1024*1024)
int main(int argc, char **argv) {
hcommInit(&argc, &argv);
int rank, size;
hcommCommRank(COMM_WORLD, &rank);
hcommCommSize(COMM_WORLD, &size);
char *send_buf = hcommMalloc(BUF_SIZE);
char *recv_buf = hcommMalloc(BUF_SIZE);
if(rank == 0) {
sprintf(send_buf, "Hello from rank 0");
hcommSend(send_buf, BUF_SIZE, 1, 0, COMM_WORLD);
} else {
hcommRecv(recv_buf, BUF_SIZE, 0, 0, COMM_WORLD);
printf("Received: %s\n", recv_buf);
}
hcommFree(send_buf);
hcommFree(recv_buf);
hcommFinalize();
return 0;
}
