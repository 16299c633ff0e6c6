/* PLACEHOLDER: being written (issue 6). */
int main(void) { return 0; }
