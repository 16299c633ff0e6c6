/* PLACEHOLDER: being written (issue 5). */
int main(void) { return 0; }
