/* A stand-in libibverbs.so.1 (test kit only): what rdma-core's libibverbs does on a machine with
   no RDMA device. Mooncake's transfer engine links it; the kit runs Mooncake over TCP on loopback
   (MC_FORCE_TCP=1), where no verbs call is made beyond finding that there is no device. The
   symbol versions come from libibverbs.map (the ones Mooncake's wheel asks for). */
#include <errno.h>
#include <stdlib.h>

void **ibv_get_device_list(int *num_devices) {
    if (num_devices) *num_devices = 0;
    return calloc(1, sizeof(void *)); /* an empty, NULL-terminated list */
}
void ibv_free_device_list(void **list) { free(list); }
int ibv_fork_init(void) { return 0; }
const char *ibv_get_device_name(void *device) { (void)device; return NULL; }
const char *ibv_event_type_str(int event) { (void)event; return "unknown (libibverbs stub)"; }
const char *ibv_wc_status_str(int status) { (void)status; return "unknown (libibverbs stub)"; }
void ibv_ack_async_event(void *event) { (void)event; }
void ibv_ack_cq_events(void *cq, unsigned int nevents) { (void)cq; (void)nevents; }

/* No device can be opened, so nothing below is reachable; each fails as on a missing device. */
#define NULL_STUB(name) void *name(void) { errno = ENODEV; return NULL; }
#define INT_STUB(name) int name(void) { errno = ENODEV; return ENODEV; }
NULL_STUB(ibv_open_device)
NULL_STUB(ibv_alloc_pd)
NULL_STUB(ibv_create_comp_channel)
NULL_STUB(ibv_create_cq)
NULL_STUB(ibv_create_qp)
NULL_STUB(ibv_reg_mr)
NULL_STUB(ibv_reg_mr_iova2)
INT_STUB(ibv_close_device)
INT_STUB(ibv_dealloc_pd)
INT_STUB(ibv_dereg_mr)
INT_STUB(ibv_destroy_comp_channel)
INT_STUB(ibv_destroy_cq)
INT_STUB(ibv_destroy_qp)
INT_STUB(ibv_get_async_event)
INT_STUB(ibv_get_cq_event)
INT_STUB(ibv_modify_qp)
INT_STUB(ibv_query_device)
INT_STUB(ibv_query_gid)
INT_STUB(ibv_query_port)
INT_STUB(ibv_query_qp)
INT_STUB(_ibv_query_gid_ex)
