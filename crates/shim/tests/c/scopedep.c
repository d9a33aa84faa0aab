void scopedep_marker(void) {}
